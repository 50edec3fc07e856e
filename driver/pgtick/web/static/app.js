// pgtick dashboard: confirmation prompts, a back link, and auto-refresh of live pages.
// Plain script, no dependencies; every page also works without it.
"use strict";

function wire(root) {
  root.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.getAttribute("data-confirm"))) {
        event.preventDefault();
      }
    });
  });
  root.querySelectorAll("a[data-back]").forEach(function (link) {
    link.addEventListener("click", function (event) {
      if (window.history.length > 1) {
        event.preventDefault();
        window.history.back();
      }
    });
  });
}

function autoRefresh() {
  var main = document.getElementById("main");
  var seconds = main && parseInt(main.getAttribute("data-refresh") || "0", 10);
  if (!seconds) {
    return;
  }
  var key = "pgtick.autoRefresh";
  var box = document.getElementById("auto-refresh");
  if (box) {
    box.checked = window.localStorage.getItem(key) !== "off";
    box.addEventListener("change", function () {
      window.localStorage.setItem(key, box.checked ? "on" : "off");
    });
  }
  window.setInterval(function () {
    var active = document.activeElement;
    var busy = active && active.closest && active.closest("form");
    if (document.hidden || busy || (box && !box.checked)) {
      return;
    }
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Refresh": "1" } })
      .then(function (response) {
        if (!response.ok) {
          stale("the dashboard answered " + response.status + (
            response.status === 503 ? " (database unavailable)"
              : response.status === 504 ? " (the database did not answer in time)" : ""));
          return null;
        }
        return response.text();
      })
      .then(function (html) {
        if (!html) {
          return;
        }
        stale(null);
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("main");
        if (!fresh) {
          return;
        }
        fresh.querySelectorAll(".flash").forEach(function (node) { node.remove(); });
        main.replaceChildren.apply(main, Array.from(fresh.childNodes));
        box = document.getElementById("auto-refresh");
        if (box) {
          box.checked = window.localStorage.getItem(key) !== "off";
          box.addEventListener("change", function () {
            window.localStorage.setItem(key, box.checked ? "on" : "off");
          });
        }
        wire(main);
      })
      .catch(function () { stale("the dashboard did not answer"); });
  }, seconds * 1000);
}

// A refresh that failed leaves the page as it was: say so above it, with since when, so
// nobody reads stale numbers as current; the next refresh that works takes the note away.
var staleSince = null;
function stale(why) {
  var note = document.getElementById("stale");
  if (!why) {
    staleSince = null;
    if (note) { note.remove(); }
    return;
  }
  staleSince = staleSince || new Date();
  if (!note) {
    note = document.createElement("p");
    note.id = "stale";
    note.className = "flash error";
    var main = document.getElementById("main");
    main.parentNode.insertBefore(note, main);
  }
  note.textContent = "Not refreshed since " + staleSince.toISOString().slice(11, 19) + "Z: " + why + ". What follows may be out of date.";
}

document.addEventListener("DOMContentLoaded", function () {
  wire(document);
  autoRefresh();
});
