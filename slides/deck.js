// minillm slides: keyboard / click navigation, slide k at #k. No dependencies.
(function () {
  "use strict";
  var slides = Array.prototype.slice.call(document.querySelectorAll("section.slide"));
  var bar = document.querySelector(".progress div");
  var current = -1;

  function fromHash() {
    var n = parseInt(window.location.hash.replace("#", ""), 10);
    return isNaN(n) ? 0 : n - 1;
  }

  function show(i) {
    i = Math.max(0, Math.min(slides.length - 1, i));
    if (i === current) return current;
    if (current >= 0) slides[current].classList.remove("active");
    current = i;
    slides[current].classList.add("active");
    document.body.setAttribute("data-current", String(current + 1));
    if (bar) bar.style.width = (100 * (current + 1) / slides.length) + "%";
    var title = slides[current].getAttribute("data-title");
    if (title) document.title = title + " (" + (current + 1) + "/" + slides.length + ")";
    if (fromHash() !== current) {
      try { history.replaceState(null, "", "#" + (current + 1)); } catch (e) { /* file:// */ }
    }
    return current;
  }

  var NEXT = ["ArrowRight", "ArrowDown", "PageDown", " ", "Enter", "l", "j"];
  var PREV = ["ArrowLeft", "ArrowUp", "PageUp", "Backspace", "h", "k"];
  document.addEventListener("keydown", function (e) {
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    if (NEXT.indexOf(e.key) >= 0) { show(current + 1); e.preventDefault(); }
    else if (PREV.indexOf(e.key) >= 0) { show(current - 1); e.preventDefault(); }
    else if (e.key === "Home") { show(0); e.preventDefault(); }
    else if (e.key === "End") { show(slides.length - 1); e.preventDefault(); }
    else if (e.key === "n") { document.body.classList.toggle("show-notes"); }
  });
  document.addEventListener("click", function (e) {
    if (e.target.closest("a, .notes") || window.getSelection().toString()) return;
    show(e.clientX > window.innerWidth / 3 ? current + 1 : current - 1);
  });
  window.addEventListener("hashchange", function () { show(fromHash()); });

  window.deck = {
    show: show,
    next: function () { return show(current + 1); },
    prev: function () { return show(current - 1); },
    get index() { return current; },
    count: slides.length
  };
  show(fromHash());
})();
