"""The representation record (``csd.representation``): one name for how a pair holds its numbers, read back
from the files written before it (memory files, results, profiles, streams)."""
import pytest

from csd.memory import CorrectionMemory
from csd.representation import Representation


def test_the_label_names_an_int8_targets_scales_and_only_its():
    assert Representation("int8", "int4", "row").label == "int8, activations per token"
    assert Representation("int8", "int8", "pass").label == "int8, activations per pass"
    assert Representation("float32", "float32").label == "float32"
    assert len(Representation("int8", activations="pass").label) <= 32      # the store's column
    assert Representation("bfloat16").with_activations("row").activations == ""
    assert [r.exact_rows for r in (Representation("int8", activations="row"),
                                   Representation("int8", activations="pass"),
                                   Representation("float32"), Representation("bfloat16"),
                                   Representation("gguf"))] == [True, False, True, False, True]
    with pytest.raises(ValueError, match="choose row or pass"):
        Representation("int8", activations="token")
    with pytest.raises(ValueError, match="choose row or pass"):
        Representation("int8").with_activations("token")
    assert Representation("int8", activations="row").with_activations("") == Representation("int8", activations="row")


@pytest.mark.parametrize("old, want", [
    ({"target_repr": "int8, activations per pass", "draft_repr": "int4"}, ("int8", "int4", "pass")),   # a stored run
    ({"target_repr": "int8", "draft_repr": "int8", "int8_activations": "row"}, ("int8", "int8", "row")),  # describe()
    ({"dtype": "int8", "draft_dtype": "int4"}, ("int8", "int4", "")),                                     # results.json
    ({"target_repr": "bfloat16", "int8_activations": "row"}, ("bfloat16", "", "")),
    ({}, ("", "", "")),
])
def test_files_from_before_the_record_read_back(old, want):
    assert tuple(Representation.of(old).as_dict().values()) == want
    new = Representation(*want) if want[0] else None
    if new is not None:
        assert Representation.of({"representation": new.as_dict()}) == new


def test_a_memory_file_names_the_representation_it_was_calibrated_with(tmp_path):
    class Pair:
        rep = Representation("int8", "int4", "row")
    old = CorrectionMemory("p", {(1, 2): 3}, meta={"calibration": [{"target_repr": "bfloat16", "draft_repr": "int4"}]})
    new = CorrectionMemory("p", {(1, 2): 3}, meta={"calibration": [{"representation": Pair.rep.as_dict()}]})
    assert CorrectionMemory.load(old.save(tmp_path / "old.json")).mismatch(Pair) == \
        "the correction memory was calibrated with target bfloat16 (loaded: int8)"
    assert CorrectionMemory.load(new.save(tmp_path / "new.json")).mismatch(Pair) is None
