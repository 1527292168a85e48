"""A griffe extension for the API reference: attnlens' reST-flavoured docstrings as Markdown.

mkdocstrings renders docstrings as Markdown; attnlens' docstrings are Markdown-compatible prose
with a few reStructuredText habits, which this extension (``mkdocs.yml``, mkdocstrings'
``extensions``) rewrites before rendering:

- roles, ``:func:`~attnlens.papa.fit```, ``:class:`Batch```, ...: a link to the object's
  section of the API reference when it is documented (an *optional* autorefs reference, which
  stays plain code and raises no warning when it is not), shown as code;
- ``.. math::`` blocks: ``$$ ... $$`` (pymdownx.arithmatex, typeset by the bundled MathJax);
- a paragraph ending in ``::`` (a reST literal block follows): ``:``.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`(?P<target>[^`]+)`")
MATH = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*(?P<first>.*)$")


def autoref(target: str, module: str) -> str:
    """``~a.b.c`` -> a link titled ``c`` to ``a.b.c``; a relative name is looked up in ``module``."""
    target = target.strip()
    explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^>]+)>", target)  # :func:`title <a.b>`
    if explicit:
        title, target = explicit["title"], explicit["target"]
    else:
        title = target[1:].rsplit(".", 1)[-1] if target.startswith("~") else target
    target = target.lstrip("~").removesuffix("()")
    identifier = target if target.startswith("attnlens") else f"{module}.{target}"
    return (f'<autoref identifier="{html.escape(identifier)}" optional>'
            f"<code>{html.escape(title)}</code></autoref>")


def convert_math(text: str) -> str:
    """``.. math:: a\\n     b`` (and its indented continuation) -> a ``$$`` block."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        match = MATH.match(lines[i])
        if not match:
            out.append(lines[i])
            i += 1
            continue
        indent = len(match["indent"])
        body = [match["first"].strip()] if match["first"].strip() else []
        i += 1
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
            if lines[i].strip():
                body.append(lines[i].strip())
            elif body:
                break
            i += 1
        out += [match["indent"] + "$$", *(match["indent"] + line for line in body), match["indent"] + "$$"]
    return "\n".join(out)


def to_markdown(text: str, module: str) -> str:
    text = convert_math(text)
    text = ROLE.sub(lambda m: autoref(m["target"], module), text)
    return re.sub(r"(?<=\S)::[ \t]*$", ":", text, flags=re.M)


class ReSTRoles(griffe.Extension):
    """Rewrites every docstring of the loaded package (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            module = obj.module.path if not obj.is_module else obj.path
            obj.docstring.value = to_markdown(obj.docstring.value, module)
