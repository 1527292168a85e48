// MathJax 3 (vendor/mathjax/tex-svg.js, bundled with the site). On the site's own pages it
// typesets what pymdownx.arithmatex marks: \( ... \) inline and \[ ... \] displayed, inside
// .arithmatex only. On a gallery page (a notebook rendered by mkdocs-jupyter, inside
// .jupyter-wrapper) it typesets the notebook's $ ... $ and $$ ... $$ as Jupyter does, code aside.
// mkdocs-jupyter loads this file once more at the top of a notebook (custom_mathjax_url), before
// the notebook is on the page; the copy of extra_javascript, after it, sets the configuration
// that MathJax reads.
(function () {
  var notebook = document.querySelector(".jupyter-wrapper") !== null;
  window.MathJax = {
    tex: {
      inlineMath: notebook ? [["$", "$"], ["\\(", "\\)"]] : [["\\(", "\\)"]],
      displayMath: notebook ? [["$$", "$$"], ["\\[", "\\]"]] : [["\\[", "\\]"]],
      processEscapes: true,
      processEnvironments: true,
    },
    options: notebook
      ? { enableMenu: false }
      : {
          ignoreHtmlClass: ".*|",
          processHtmlClass: "arithmatex",
          enableMenu: false, // the menu would load accessibility extensions on demand
        },
    svg: { fontCache: "global" },
  };
})();
