// The console's only script, and an optional one: every page works without it.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  // A confirm button is pressed once: a second press would only meet "a move is in progress".
  for (const form of document.querySelectorAll("form[method=post]")) {
    form.addEventListener("submit", () => {
      for (const button of form.querySelectorAll("button[type=submit]")) button.disabled = true;
    });
  }
});
