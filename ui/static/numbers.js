// CSD Explorer's number boxes, taken as typed (read by ui/render.py beside app.js). A browser's
// <input type=number> drops what is not a number: "abc" typed into λ's box left it empty, gradio's
// slider then made it 0 and the run used λ 0; Compare's max new tokens became 1; the seed box became
// empty (no seed). And every keystroke was sent: "-" (on its way to "-1") drew "got nothing".
// So each number box of the page (a slider's and a gr.Number's) becomes a text box (inputmode
// decimal, for phones); what is typed is read when the box loses focus or on Enter, not on each
// keystroke: a number goes to gradio as before (whose check on the server refuses one out of range,
// with its range named), anything else stays in the box as typed, marked, with a line under the box
// that names it by its label; and Generate, Compare, Teach's Run and Calibrate refuse to start while a
// box of the bar or of their tab holds one. A box whose component has the class csd-optional (the seed)
// may be left empty.
(() => {
  if (window.csdNumbers) return;
  window.csdNumbers = true;
  const NUMBER = /^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$/;
  const STATUS = {'generate-btn': 'gen-status', 'compare-btn': 'compare-status', 'teach-run': 'teach-status',
                  'calibrate-btn': 'calibrate-status'};      // a run's button -> the status line beside it
  const RUNS = Object.keys(STATUS).map(id => '#' + id).join(', ');
  let passing = false;          // our own events, sent on to gradio
  const boxes = () => document.querySelectorAll('input[data-csd-number]');
  const own = (e) => e.target instanceof HTMLInputElement && e.target.hasAttribute('data-csd-number');
  const label = (box) => {
    const block = box.closest('.block');
    const info = block && block.querySelector('[data-testid=block-info]');
    return (info ? info.textContent : box.getAttribute('aria-label') || 'This box').trim();
  };
  // the words of csd/numbers.py (Field.words), large numbers grouped as the app writes them: 100,000,000
  const num = (x) => Number(x).toLocaleString('en-US', {maximumSignificantDigits: 6});
  const range = (box) => {
    const step = Number(box.getAttribute('step') || 0);
    const [lo, hi] = ['min', 'max'].map(a => box.getAttribute(a) === null ? null : num(box.getAttribute(a)));
    const whole = step === 1 && (lo === null || Number(box.getAttribute('min')) % 1 === 0);
    const kind = whole ? 'a whole number' : 'a number';
    if (lo !== null && hi !== null) return whole ? `${kind} from ${lo} to ${hi}` : `between ${lo} and ${hi}`;
    if (lo !== null) return `${kind}, ${lo} or more`;
    if (hi !== null) return `${kind}, ${hi} or less`;
    return kind;
  };
  const optional = (box) => !!box.closest('.csd-optional');
  // the sentence for a box's text, or '' when gradio may have it
  const problem = (box) => {
    const text = box.value.trim();
    if (text === '' ? optional(box) : NUMBER.test(text)) return '';
    const got = text === '' ? 'it is empty' : `got "${text}"`;
    return `${label(box)} must be ${range(box)}; ${got}.`;
  };
  const note = (box, message) => {
    const block = box.closest('.block');
    let line = block && block.querySelector(':scope > .csd-number-error');
    if (!message) {
      box.removeAttribute('aria-invalid');
      if (line) line.remove();
      settled();
      return;
    }
    box.setAttribute('aria-invalid', 'true');
    if (!line && block) {
      line = document.createElement('div');
      line.className = 'csd-number-error';
      line.setAttribute('role', 'alert');
      block.append(line);
    }
    if (line) line.textContent = message;
  };
  // the box's text to gradio, as if typed into the number box it was (its value is read as a number)
  const commit = (box) => {
    const message = problem(box);
    note(box, message);
    if (message || box.getAttribute('data-csd-sent') === box.value) return !message;
    passing = true;
    try {
      box.type = 'number';
      box.dispatchEvent(new Event('input', {bubbles: true}));
      box.dispatchEvent(new Event('change', {bubbles: true}));
    } finally {
      box.type = 'text';
      passing = false;
    }
    box.setAttribute('data-csd-sent', box.value);
    return true;
  };
  const adopt = () => document.querySelectorAll('input[type=number]').forEach(box => {
    if (!box.closest('.gradio-container') && !box.closest('.block')) return;
    box.setAttribute('data-csd-number', '');
    box.setAttribute('data-csd-sent', box.value);
    box.type = 'text';
    box.inputMode = 'decimal';
    box.setAttribute('autocomplete', 'off');
  });
  // while typing: nothing reaches gradio (it would read a half-typed "-" as nothing)
  window.addEventListener('input', (e) => {
    if (passing || !own(e)) return;
    e.stopImmediatePropagation();
    if (e.target.hasAttribute('aria-invalid') && !problem(e.target)) note(e.target, '');
  }, true);
  window.addEventListener('change', (e) => { if (!passing && own(e)) { e.stopImmediatePropagation(); commit(e.target); } }, true);
  // leaving the box: its text is read. Gradio's slider clamps its box on blur, while the box keeps what was
  // typed, so a run would use a value the page does not show (λ -1 ran as 0, γ 1000 as 32): that handler is
  // kept from running for text that is not a number and for a number out of the slider's range, which the
  // server's check of the slider (csd.ui.tabs.inputs) refuses with its range named, before anything runs.
  const outside = (box) => {
    const block = box.closest('.block');
    if (!block || !block.querySelector('input[type=range]') || box.value.trim() === '') return false;
    const v = Number(box.value), lo = box.getAttribute('min'), hi = box.getAttribute('max');
    return (lo !== null && v < Number(lo)) || (hi !== null && v > Number(hi));
  };
  window.addEventListener('blur', (e) => {
    if (!own(e)) return;
    if (!commit(e.target) || outside(e.target)) e.stopImmediatePropagation();
  }, true);
  window.addEventListener('keydown', (e) => {
    if (own(e) && e.key === 'Enter' && !commit(e.target)) { e.preventDefault(); e.stopImmediatePropagation(); }
  }, true);
  // the slider dragged: its box shows the slider's value again
  window.addEventListener('input', (e) => {
    if (!(e.target instanceof HTMLInputElement) || e.target.type !== 'range') return;
    const block = e.target.closest('.block');
    const box = block && block.querySelector('input[data-csd-number]');
    if (box) setTimeout(() => { note(box, ''); box.setAttribute('data-csd-sent', box.value); }, 0);
  }, true);
  // a run asked for while a box of the bar or of its tab holds what is not a number: not started, and
  // the status line beside the button says which box
  window.addEventListener('click', (e) => {
    const btn = e.target instanceof Element && e.target.closest(RUNS);
    if (!btn) return;
    const panel = btn.closest('[role=tabpanel]') || document;
    const bad = [...boxes()].filter(b => (panel.contains(b) || !b.closest('#tabs')) && problem(b));
    if (!bad.length) return;
    e.preventDefault();
    e.stopImmediatePropagation();
    bad.forEach(b => note(b, problem(b)));
    const line = document.querySelector('#' + STATUS[btn.id] + ' .csd-status-line');
    if (line) {
      if (!line.hasAttribute('data-csd-box')) {      // what the line said before: back once the boxes are fixed
        line.setAttribute('data-csd-was', line.textContent);
        line.setAttribute('data-csd-was-state', line.getAttribute('data-state') || 'idle');
      }
      line.setAttribute('data-csd-box', btn.id);
      line.textContent = `Not run: ${problem(bad[0])}`;
      line.setAttribute('data-state', 'stopped');
    }
    bad[0].focus();
  }, true);
  // a box corrected: a status line that still names a box's refusal says again what it said before (Ready. after a
  // refusal), once no box its button reads holds what is not a number (a line the server sent since is kept)
  const settled = () => document.querySelectorAll('.csd-status-line[data-csd-box]').forEach(line => {
    const btn = document.getElementById(line.getAttribute('data-csd-box'));
    const panel = (btn && btn.closest('[role=tabpanel]')) || document;
    if ([...boxes()].some(b => (panel.contains(b) || !b.closest('#tabs')) && problem(b))) return;
    const state = line.getAttribute('data-csd-was-state') || 'idle';     // an older refusal is not said again
    line.textContent = state === 'stopped' ? 'Ready.' : line.getAttribute('data-csd-was') || 'Ready.';
    line.setAttribute('data-state', state === 'stopped' ? 'idle' : state);
    ['data-csd-box', 'data-csd-was', 'data-csd-was-state'].forEach(a => line.removeAttribute(a));
  });
  // a click the server refused before its handler ran (a value out of a slider's range, from the API or the page):
  // its status line says "the message says why"; it says why itself, from the error toast that gives the reason,
  // so that the reason stays beside the button once the toast is gone
  const REFUSED = ' (the message says why).';
  let said = {text: '', at: 0};
  const explain = () => {
    const toast = [...document.querySelectorAll('.toast-message-text.error')].pop();
    const text = toast ? toast.textContent.trim() : '';
    if (text && text !== said.text) said = {text, at: Date.now()};
    if (!said.text || Date.now() - said.at > 15000) return;
    document.querySelectorAll('.csd-status-line').forEach(line => {
      if (line.textContent.endsWith(REFUSED)) line.textContent = line.textContent.replace(REFUSED, `: ${said.text}`);
    });
  };
  adopt();
  new MutationObserver(() => { adopt(); explain(); }).observe(document.documentElement,
                                                               {childList: true, subtree: true, characterData: true});
})();
