// The live parts of the fleet dashboard; the page reads fine without them.
// - Countdowns: every <time data-countdown> shows "in 4m 12s" / "3m ago", ticking each second.
// - Timeline: on a narrow screen, scrolled so that now and the days to come show.
// - Updates: polls /dashboard/version (a token that changes with the store) and, when it
//   changed, fetches the same URL (filters included) and swaps <main>: no reload, the
//   filter form and the scroll position stay as they are.
"use strict";
(function () {
  const POLL_MS = 2000;

  function relative(seconds) {
    const span = Math.abs(Math.trunc(seconds));
    const d = Math.floor(span / 86400), h = Math.floor((span % 86400) / 3600);
    const m = Math.floor((span % 3600) / 60), s = span % 60;
    const two = (n) => String(n).padStart(2, "0");
    let text;
    if (d) text = d + "d " + two(h) + "h";
    else if (h) text = h + "h " + two(m) + "m";
    else if (m) text = m + "m " + two(s) + "s";
    else text = s + "s";
    return seconds >= 0 ? "in " + text : text + " ago";
  }

  function tick() {
    const now = Date.now();
    for (const el of document.querySelectorAll("time[data-countdown]")) {
      const at = Date.parse(el.getAttribute("datetime"));
      if (!Number.isNaN(at)) el.textContent = relative((at - now) / 1000);
    }
  }

  async function refresh() {
    const main = document.getElementById("content");
    if (!main) return;
    const status = document.getElementById("live-status");
    try {
      const answer = await fetch(main.dataset.versionUrl, { cache: "no-store" });
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      const { version } = await answer.json();
      if (version !== main.dataset.version) {
        const page = await fetch(window.location.href, { cache: "no-store" });
        // 404: an instance not heard from yet; its page says so and is swapped in too.
        if (!page.ok && page.status !== 404) throw new Error("HTTP " + page.status);
        const doc = new DOMParser().parseFromString(await page.text(), "text/html");
        const fresh = doc.getElementById("content");
        if (fresh) {
          const plot = document.getElementById("timeline-plot");
          const scrolled = plot ? plot.scrollLeft : null;
          main.innerHTML = fresh.innerHTML;
          main.dataset.version = fresh.dataset.version;
          tick();
          timeline(scrolled);
        }
      }
      if (status) status.textContent = "· live";
    } catch (error) {
      // The service restarting or the network gone: say so and keep trying.
      if (status) status.textContent = "· updates paused (" + error.message + ")";
    }
  }

  // The timeline on a narrow screen: its drawing scrolls sideways, and opens with `now`
  // near the left edge so the days to come are in view (the past is a swipe away). After a
  // live update the reader's own scroll position is kept instead.
  function timeline(scrolled) {
    const plot = document.getElementById("timeline-plot");
    const svg = document.getElementById("timeline-svg");
    if (!plot || !svg || plot.scrollWidth <= plot.clientWidth) return;
    if (scrolled !== null && scrolled !== undefined) {
      plot.scrollLeft = scrolled;
      return;
    }
    const now = Number(svg.dataset.nowX);
    if (!Number.isNaN(now)) plot.scrollLeft = Math.max(0, now - plot.clientWidth * 0.15);
  }

  // The filters: a choice applies at once, and the URL keeps only the filters that are set
  // (the form alone, without this script, sends the empty ones too; the server ignores them).
  function filters() {
    const form = document.querySelector("form.filters");
    if (!form) return;
    for (const select of form.querySelectorAll("select")) {
      select.addEventListener("change", () => form.requestSubmit());
    }
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const query = new URLSearchParams();
      for (const [key, value] of new FormData(form)) {
        if (String(value).trim()) query.append(key, String(value).trim());
      }
      const text = query.toString();
      window.location.assign(form.getAttribute("action") + (text ? "?" + text : ""));
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    tick();
    filters();
    timeline(null);
    setInterval(tick, 1000);
    setInterval(refresh, POLL_MS);
  });
})();
