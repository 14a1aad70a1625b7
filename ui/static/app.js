// CSD Explorer's page script: read by ui/render.py at start-up and handed to gradio in a
// <script> tag with launch(head=...). Token details on click (pinned), next rescued / next
// rejected, arrow keys for the Teach view, one toast at a time, and the mark on a table that
// scrolls sideways. Listeners sit on the document, so they keep working while gradio replaces
// the HTML inside the components.
(() => {
  if (window.csdInstalled) return;
  window.csdInstalled = true;
  const pins = {};
  const show = (tok) => {
    const box = tok.closest('[data-csd-view]');
    const view = box ? box.getAttribute('data-csd-view') : 'tokens';
    document.querySelectorAll('.tok.pinned').forEach(t => { if (t.closest('[data-csd-view]') === box) t.classList.remove('pinned'); });
    tok.classList.add('pinned');
    pins[view] = tok.getAttribute('data-i');
    const name = (box && box.getAttribute('data-csd-panel')) || view;
    const panel = document.querySelector('#' + name + '-detail .csd-detail-body');
    if (!panel) return;
    const lines = (tok.getAttribute('data-detail') || '').split('\n');
    panel.parentElement.hidden = false;
    panel.replaceChildren();
    const first = document.createElement('div'); first.className = 'first'; first.textContent = lines[0];
    const rest = document.createElement('div'); rest.textContent = lines.slice(1).join('\n');
    panel.append(first, rest);
  };
  document.addEventListener('click', (e) => {
    if (e.target.closest('#generate-btn, #compare-btn')) {     // a new answer: nothing stays pinned
      for (const k of Object.keys(pins)) delete pins[k];
      document.querySelectorAll('.csd-detail').forEach(d => { d.hidden = true; });
      return;
    }
    const close = e.target.closest('[data-csd-close]');
    if (close) { const d = close.closest('.csd-detail'); if (d) d.hidden = true;
                 document.querySelectorAll('.tok.pinned').forEach(t => t.classList.remove('pinned')); return; }
    const mark = e.target.closest('.csd-fold-mark');
    if (mark) {          // the reading view: a fold of rejected draft tokens opened or closed
      const open = mark.parentElement.classList.toggle('open');
      mark.setAttribute('aria-expanded', String(open));
      return;
    }
    const nav = e.target.closest('[data-nav]');
    if (nav) {
      const box = nav.closest('[data-csd-view]');
      const want = nav.getAttribute('data-nav');
      const toks = [...box.querySelectorAll('.tok[data-status="' + want + '"]')];
      if (!toks.length) return;
      const cur = box.querySelector('.tok.pinned');
      const at = cur ? Number(cur.getAttribute('data-i')) : -1;
      const next = toks.find(t => Number(t.getAttribute('data-i')) > at) || toks[0];
      const fold = next.closest('.csd-fold');
      if (fold) fold.classList.add('open');
      next.scrollIntoView({block: 'center'});
      show(next);
      return;
    }
    const go = e.target.closest('[data-goto]');
    if (go) {
      const view = go.closest('[data-csd-for]').getAttribute('data-csd-for');
      const box = document.querySelector('[data-csd-view="' + view + '"]');
      const t = box && box.querySelector('.tok[data-i="' + go.getAttribute('data-goto') + '"]');
      if (t) { t.scrollIntoView({block: 'center'}); show(t); }
      return;
    }
    const tok = e.target.closest('[data-csd-view] .tok[data-i]');
    if (tok) show(tok);
  });
  // one toast at a time: a new message closes the other toasts; gradio groups the messages of one
  // kind (error, warning, info) in one toast whose close button closes them all, so there the older
  // messages are only hidden (the toast still closes itself 10 s after its first message)
  const seen = new WeakSet();
  const oneToast = () => {
    const items = [...document.querySelectorAll('.toast-message-item')];
    const fresh = items.filter(i => !seen.has(i));
    if (!fresh.length) return;
    items.forEach(i => seen.add(i));
    const newest = fresh[fresh.length - 1];
    const body = newest.closest('.toast-body');
    document.querySelectorAll('.toast-body').forEach(b => {
      if (b !== body && !b.hasAttribute('data-csd-closing')) {
        b.setAttribute('data-csd-closing', '1');
        const x = b.querySelector('.toast-close');
        if (x) x.click();
      }
    });
    items.forEach(i => { if (i !== newest && i.closest('.toast-body') === body) i.setAttribute('data-csd-old', '1'); });
    if (body) body.setAttribute('data-csd-one', '1');
  };
  // a table wider than its box: data-scrolls="more" while columns are off to the right, "end" at the end
  // (checked again when the box changes size: a tab shown, a window turned)
  const watched = new WeakSet();
  const sizes = new ResizeObserver(() => markScrollers());
  const markScrollers = () => document.querySelectorAll('.csd-scroll').forEach(s => {
    const box = s.closest('.csd-scroll-box');
    if (!box) return;
    if (!watched.has(s)) { watched.add(s); sizes.observe(s); }
    const state = s.scrollWidth <= s.clientWidth + 1 ? 'no'
      : s.scrollLeft + s.clientWidth >= s.scrollWidth - 2 ? 'end' : 'more';
    if (box.getAttribute('data-scrolls') !== state) box.setAttribute('data-scrolls', state);
  });
  window.addEventListener('resize', markScrollers);
  document.addEventListener('scroll', (e) => { if (e.target.classList && e.target.classList.contains('csd-scroll')) markScrollers(); }, true);
  // Teach: after a click on Run, Next or Back, bring the iteration it drew into view once (at 1280x720
  // the view starts below the fold, so Next seemed to change nothing)
  let teachAsked = 0;
  document.addEventListener('click', (e) => {
    if (e.target.closest('#teach-run, #teach-next, #teach-prev')) teachAsked = Date.now();
  }, true);
  function showTeach() {
    if (!teachAsked || Date.now() - teachAsked > 120000) return;
    const block = document.querySelector('#teach-view .csd-block');
    if (!block || block.offsetParent === null) return;
    teachAsked = 0;
    const r = block.getBoundingClientRect();
    if (r.top >= 0 && r.bottom <= window.innerHeight) return;
    const next = document.querySelector('#teach-next');       // its buttons too, where they fit beside it
    const top = next && next.offsetParent !== null ? Math.min(next.getBoundingClientRect().top, r.top) : r.top;
    window.scrollBy(0, (r.bottom - top <= window.innerHeight - 16 ? top : r.top) - 8);
  }
  // a phone: the bar of settings starts folded, so that the prompt and Generate are on the first screen
  // (clicked until it shows folded: a click before gradio has wired the toggle does nothing; then left alone)
  let barFolded = window.innerWidth >= 700, barTries = 0;
  const foldBar = () => {
    const toggle = !barFolded && document.querySelector('#bar .label-wrap');
    if (!toggle) return;
    if (!toggle.classList.contains('open') || ++barTries > 50) { barFolded = true; return; }
    toggle.click();
    setTimeout(foldBar, 100);
  };
  // keep a pinned token pinned while the answer streams in (the HTML is replaced at every pass)
  new MutationObserver(() => {
    foldBar();
    showTeach();
    for (const [view, i] of Object.entries(pins)) {
      const box = document.querySelector('[data-csd-view="' + view + '"]');
      const t = box && box.querySelector('.tok[data-i="' + i + '"]');
      if (t && !t.classList.contains('pinned')) t.classList.add('pinned');
    }
    oneToast();
    markScrollers();
  }).observe(document.body, {childList: true, subtree: true});
  document.addEventListener('keydown', (e) => {
    if (e.target.closest('input, textarea, select, [contenteditable]')) return;
    const teach = document.querySelector('#teach-view');
    if (!teach || teach.offsetParent === null) return;
    const id = e.key === 'ArrowRight' ? '#teach-next' : e.key === 'ArrowLeft' ? '#teach-prev' : null;
    if (!id) return;
    const b = document.querySelector(id);
    if (b) { e.preventDefault(); b.click(); }
  });
})();
