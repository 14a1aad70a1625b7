"""Gradio's sliders, number boxes and pickers whose ``preprocess`` refuses a value out of range with a sentence
naming the setting and its range; inputs only (why: docs/design.md, "Checked inputs")."""
from __future__ import annotations

import types

import gradio as gr

from csd.numbers import Field

from .common import error, read_number


def range_words(lo: float | None, hi: float | None, whole: bool) -> str:
    """'a whole number from 1 to 32', 'between -4 and 0', 'a whole number, 0 or more' (``csd.numbers.Field.words``)."""
    return Field("", lo, hi, whole).words()


def check_range(what: str, value, lo: float | None, hi: float | None, whole: bool, note: str = ""):
    """``value`` (a number, or text from an API call) read by ``csd.numbers``, or refused with its sentence that names
    ``what`` and the range (and ``note``: what the range means). -> the number read."""
    return read_number(Field(what, lo, hi, whole, note=note), value)


def _check_number(self: gr.Slider | gr.Number, payload):
    if payload is not None or not self.csd_optional:    # an empty optional box: no value (an empty seed is no seed)
        payload = check_range(self.csd_what, payload, self.minimum, self.maximum, self.csd_whole, self.csd_note)
    return type(self).preprocess(self, payload)


def _check_choice(self: gr.Dropdown, payload):
    values = [v for _, v in self.choices]
    if not self.allow_custom_value and not self.multiselect and payload not in values:
        raise error(f"{self.csd_what} must be one of {', '.join(map(str, values))}; got {payload!r}.")
    return type(self).preprocess(self, payload)


def _named(comp, check, what: str, note: str = "", whole: bool = False, optional: bool = False):
    comp.csd_what, comp.csd_note, comp.csd_whole, comp.csd_optional = what, note, whole, optional
    comp.preprocess = types.MethodType(check, comp)
    return comp


def slider(what: str, minimum: float, maximum: float, *, note: str = "", **kw) -> gr.Slider:
    """A gr.Slider whose refusals say "<what> must be <range> <note>; got <value>."."""
    comp = gr.Slider(minimum, maximum, **kw)
    return _named(comp, _check_number, what, note, whole=comp.step == 1 and float(minimum) % 1 == 0)


def number(what: str, *, note: str = "", optional: bool = False, **kw) -> gr.Number:
    """A gr.Number whose refusals name ``what`` and its range; an empty box passes only if ``optional`` (its class
    ``csd-optional`` tells the page's script, ``static/numbers.js``, which checks the box as typed)."""
    if optional:
        kw["elem_classes"] = [*(kw.get("elem_classes") or []), "csd-optional"]
    comp = gr.Number(**kw)
    return _named(comp, _check_number, what, note, whole=comp.precision == 0, optional=optional)


def box(field: Field, value, elem_id: str) -> gr.Number:
    """A number box drawn from a ``csd.numbers.Field``: its label, range and whole-ness, refused in its words."""
    return number(field.name, note=field.note, optional=field.optional, value=value,
                  precision=0 if field.whole else None, minimum=field.lo, maximum=field.hi, label=field.name,
                  elem_id=elem_id)


def dropdown(what: str, choices, **kw) -> gr.Dropdown:
    """A gr.Dropdown whose refusal of a value it does not offer lists the choices."""
    return _named(gr.Dropdown(choices, **kw), _check_choice, what)
