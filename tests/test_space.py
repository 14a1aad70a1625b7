"""The repository runs as a Hugging Face Space as it is: the README's front matter is what the Space
reads (sdk, app_file, ...), and the app takes the address the Space's runtime gives it and hides
other users' runs there. What can be checked without the hub is checked here."""
from pathlib import Path

import gradio
import pytest
import yaml

import csd_app

ROOT = Path(__file__).resolve().parents[1]


def front_matter() -> dict:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n"), "the README must open with the Space's front matter"
    block = text.split("---\n", 2)[1]
    return yaml.safe_load(block)


def test_the_readme_front_matter_is_a_gradio_space_on_this_app():
    fm = front_matter()
    assert fm["sdk"] == "gradio" and (ROOT / fm["app_file"]).is_file()
    assert fm["sdk_version"].split(".")[0] == gradio.__version__.split(".")[0]    # the gradio the app is built on
    assert str(fm["python_version"]) == "3.11"
    assert 0 < len(fm["short_description"]) <= 60                                   # the hub's limit
    assert {"title", "emoji", "colorFrom", "colorTo", "license"} <= set(fm)


@pytest.mark.parametrize("env, host, port, shared", [
    ({}, "127.0.0.1", 7860, True),                                            # a machine of one's own
    ({"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "7861"}, "0.0.0.0", 7861, True),
    ({"SPACE_ID": "someone/csd-explorer", "GRADIO_SERVER_NAME": "0.0.0.0"}, "0.0.0.0", 7860, False),
    ({"SPACE_ID": "someone/csd-explorer", "CSD_SHARED_SCOPE": "1"}, "127.0.0.1", 7860, True),
])
def test_the_app_takes_the_spaces_address_and_hides_other_users_runs_there(monkeypatch, env, host, port, shared):
    for k in ("SPACE_ID", "GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT", "CSD_SHARED_SCOPE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    args = csd_app.parse_args([])
    assert (args.host, args.port, args.shared_scope) == (host, port, shared)
    assert csd_app.parse_args(["--host", "127.0.0.1"]).host == "127.0.0.1"   # the flag wins over the environment
