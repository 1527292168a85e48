"""attnlens's version: one value, read by the package (``attnlens.__version__``), by
``pyproject.toml`` (setuptools' dynamic ``version``) and by the caches whose keys name it (feature
files, curve points: a file written by another version is never reused)."""

__version__ = "0.1.0"
