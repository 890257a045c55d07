// Inlined by book/_ext/minimind_book.py into every page with ipywidgets, between RequireJS and the
// ipywidgets HTML manager (@jupyter-widgets/html-manager 1.0.x), both served from _static/.
(function () {
  // 1. The manager finds its font files through RequireJS (module "@jupyter-widgets/html-manager/dist/...",
  //    resolved against the page's folder by default): point that module folder at _static/html-manager.
  var requireTag = document.querySelector('script[src*="requirejs/require.js"]');
  if (window.require && window.require.config && requireTag) {
    window.require.config({ paths: { "@jupyter-widgets/html-manager/dist": new URL("../html-manager", requireTag.src).href } });
  }
  // 2. The manager typesets widget labels with the MathJax 2 API (MathJax.Hub.Queue); the site runs MathJax 3.
  var hub = {
    Queue: function (job) {
      var el = job && job[2];
      var mj = window.MathJax;
      if (el && mj && mj.startup && mj.startup.promise && mj.typesetPromise) {
        mj.startup.promise.then(function () { return window.MathJax.typesetPromise([el]); });
      }
    },
  };
  var config = (window.MathJax = window.MathJax || {});
  config.Hub = hub; // until MathJax 3 replaces window.MathJax with itself
  var startup = (config.startup = config.startup || {});
  var ready = startup.ready;
  startup.ready = function () {
    if (ready) { ready(); } else { window.MathJax.startup.defaultReady(); }
    window.MathJax.Hub = hub;
  };
})();
