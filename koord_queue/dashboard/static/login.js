// The in-cluster dashboard's login (docs/dashboard.md#installed-in-the-cluster): the token is sent
// once, as JSON, to this server's POST /login, which checks it with the API server and keeps it
// server-side; the page then reloads the path the user asked for (or the first page).
"use strict";

function say(text, isError) {
  const box = document.getElementById("message");
  box.textContent = text;
  box.className = isError ? "message error" : "message";
  box.setAttribute("role", isError ? "alert" : "status");
  box.hidden = !text;
}

async function login(event) {
  event.preventDefault();
  const token = document.getElementById("token").value.trim();
  const namespace = document.getElementById("namespace").value.trim();
  say("Checking the token with the API server…", false);
  const response = await fetch("/login", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(namespace ? { token, namespace } : { token }),
  });
  const answer = await response.json().catch(() => ({ error: `${response.status} ${response.statusText}` }));
  if (!response.ok) {
    say(`Not logged in (${response.status}): ${answer.error || response.statusText}`, true);
    return;
  }
  document.getElementById("token").value = "";
  say(`Logged in as ${answer.user || "(unknown)"}`, false);
  const target = location.pathname === "/login" ? "/" : location.pathname;
  location.replace(target + location.search);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login").addEventListener("submit", (event) => {
    login(event).catch((error) => say(`Not logged in: ${error.message}`, true));
  });
  document.getElementById("token").focus();
});
