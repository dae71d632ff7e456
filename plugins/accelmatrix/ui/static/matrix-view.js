// The "Test matrix" navigation entry: Airflow 3.3.2 shows this React app inside its own
// page (no iframe), so every link on the matrix page works as a link of Airflow's UI.
//
// Why not an iframe: Airflow 3.3.2 shows plugin `external_views` in an iframe sandboxed with
// "allow-scripts allow-same-origin allow-forms allow-downloads", which blocks top-level
// navigation and popups: the log, Data Docs and "run in Airflow" links did nothing there.
//
// What it does: fetches the server-rendered page (/accelmatrix/<path>, the same HTML the
// app serves directly, with links pointing back into this view), strips anything active
// from it (defence in depth: the server escapes everything and sends no script), and shows
// it in a shadow root so its CSS and Airflow's do not mix. Links to Airflow's own pages
// and to other matrix pages navigate inside Airflow's router; Data Docs open in a new tab
// (their own sandboxed origin). Uses the React and React Router that Airflow's UI exposes
// on globalThis for plugins; no build step, nothing loaded from elsewhere.
const React = globalThis.React;
const { useLocation, useNavigate } = globalThis.ReactRouterDOM;
const ROUTE = "/plugin/accelmatrix";
// A tab of a DAG, DAG run or task instance page (ui/tabs.py): .../plugin/accelmatrix-<what>.
// The server maps the tab and Airflow's props to the page it shows (GET /accelmatrix/tabs/..).
const TAB = /\/plugin\/(accelmatrix-[a-z]+)\/?$/u;
const DROP = "script,iframe,frame,object,embed,base,meta,link,noscript,template";

function routerBase() {
  return new URL(document.baseURI).pathname.replace(/\/$/u, "");
}

// Schemes a link or a resource of the page may use. Judged on the URL as the browser
// parses it (new URL: entities already decoded by the DOM parser, tabs and newlines removed,
// leading spaces and control characters trimmed), so "java&#x09;script:" or " javascript:"
// is seen as javascript: and dropped. Everything else (javascript:, vbscript:, data: but
// images, blob:, file:) is dropped.
const SAFE_SCHEMES = new Set(["http:", "https:", "mailto:"]);
const URL_ATTRS = /^(href|src|action|formaction|xlink:href|poster|background|cite|ping)$/u;

function safeUrl(value, tag, name) {
  let url;
  try {
    url = new URL(value, document.baseURI);
  } catch {
    return false;
  }
  if (SAFE_SCHEMES.has(url.protocol)) return true;
  return tag === "img" && name === "src" && /^data:image\/(png|gif|jpeg|webp);/u.test(url.href);
}

function sanitize(doc) {
  doc.querySelectorAll(DROP).forEach((el) => el.remove());
  doc.querySelectorAll("*").forEach((el) => {
    for (const attr of Array.from(el.attributes)) {
      const name = attr.name.toLowerCase();
      if (name.startsWith("on") || name === "srcdoc" || name === "srcset") el.removeAttribute(attr.name);
      else if (URL_ATTRS.test(name) && !safeUrl(attr.value, el.localName, name))
        el.removeAttribute(attr.name);
    }
  });
  return doc;
}

function routerPath(url) {
  // An Airflow UI route (same origin, under the UI's base, not a plugin app's own URL).
  const base = routerBase();
  if (url.origin !== window.location.origin || !url.pathname.startsWith(`${base}/`)) return null;
  const path = url.pathname.slice(base.length);
  if (/^\/(accelmatrix|api|auth|static|ui)(\/|$)/u.test(path)) return null;
  return `${path}${url.search}${url.hash}`;
}

// Airflow 3.3.2 keeps its color mode with next-themes: class "dark" or "light" on the
// document element. The page's CSS (ui/theme.py) styles the dark theme as :host(.am-dark).
function followTheme(el) {
  const apply = () => {
    const dark = document.documentElement.classList.contains("dark");
    el.classList.toggle("am-dark", dark);
    el.dataset.theme = dark ? "dark" : "light";
  };
  apply();
  const watch = new MutationObserver(apply);
  watch.observe(document.documentElement, { attributes: true, attributeFilter: ["class"] });
  return () => watch.disconnect();
}

function tabSource(pathname, props) {
  // The page of a tab: null on the navigation entry's own route.
  const m = TAB.exec(pathname);
  if (!m || !props.dagId) return null;
  const q = new URLSearchParams({ dag_id: props.dagId });
  if (props.runId) q.set("run_id", props.runId);
  if (props.taskId) q.set("task_id", props.taskId);
  if (props.mapIndex !== undefined && props.mapIndex !== null) q.set("map_index", String(props.mapIndex));
  return new URL(`accelmatrix/tabs/${m[1]}?${q}`, document.baseURI).href;
}

function MatrixView(props) {
  const location = useLocation();
  const navigate = useNavigate();
  const host = React.useRef(null);
  const sub = location.pathname.startsWith(ROUTE) ? location.pathname.slice(ROUTE.length) : "";
  const src =
    tabSource(location.pathname, props || {}) ||
    new URL(`accelmatrix${sub || "/"}${location.search}`, document.baseURI).href;

  React.useEffect(() => followTheme(host.current), []);

  React.useEffect(() => {
    const el = host.current;
    const root = el.shadowRoot || el.attachShadow({ mode: "open" });
    const follow = (event, url) => {
      const path = routerPath(url);
      if (path === null) return;
      event.preventDefault();
      navigate(path);
    };
    const onClick = (event) => {
      if (event.defaultPrevented || event.button !== 0) return;
      if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
      const a = event.composedPath().find((n) => n instanceof Element && n.matches("a[href]"));
      if (!a || (a.target && a.target !== "_self")) return;
      follow(event, new URL(a.getAttribute("href"), document.baseURI));
    };
    const onSubmit = (event) => {
      const form = event.target;
      if (!(form instanceof HTMLFormElement) || form.method.toLowerCase() !== "get") return;
      const url = new URL(form.getAttribute("action") || "", document.baseURI);
      url.search = new URLSearchParams(new FormData(form)).toString();
      follow(event, url);
    };
    root.addEventListener("click", onClick);
    root.addEventListener("submit", onSubmit);
    let live = true;
    const started = performance.now();
    el.dataset.state = "loading";
    fetch(src, {
      credentials: "same-origin",
      headers: { Accept: "text/html", "X-Accelmatrix-Embed": "1" },
    })
      .then((r) => r.text())
      .then((text) => {
        if (!live) return;
        const doc = sanitize(new DOMParser().parseFromString(text, "text/html"));
        const style = doc.querySelector("style");
        const body = document.createElement("div");
        body.className = "am-body";
        body.append(...Array.from(doc.body.childNodes).map((n) => document.importNode(n, true)));
        root.replaceChildren(...(style ? [document.importNode(style, true)] : []), body);
        if (location.hash) root.getElementById(decodeURIComponent(location.hash.slice(1)))?.scrollIntoView();
        el.dataset.state = "ready";
        el.dataset.src = src;
        el.dataset.ms = String(Math.round(performance.now() - started)); // fetch to shown
      })
      .catch((err) => {
        if (!live) return;
        const p = document.createElement("p");
        p.textContent = `The matrix page could not be loaded: ${err}`;
        root.replaceChildren(p);
        el.dataset.state = "error";
      });
    return () => {
      live = false;
      root.removeEventListener("click", onClick);
      root.removeEventListener("submit", onSubmit);
    };
  }, [src]);

  return React.createElement("div", {
    ref: host,
    id: "accelmatrix-view",
    // No background here: the page's :host rules set it (light or dark, ui/theme.py).
    style: { height: "100%", overflow: "auto" },
  });
}

globalThis.AirflowPlugin = MatrixView;
