"""Writers replace a link inside the folder they write, never write through it: a user's file the
link points at, outside that folder, stays as it was."""
import pytest

from bertkit.cli import main


def _linked(out, name, tmp_path):
    """OUT/name -> ../mine.txt, a file of the user's outside OUT."""
    mine = tmp_path / "mine.txt"
    mine.write_text("the user's own file\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / name).symlink_to(mine)
    return mine


@pytest.mark.parametrize("name", ["vocab.txt", "config.json", "onnx.json"])
def test_export_overwrite_replaces_a_link_in_out(tmp_path, tiny_bert, name):
    out = tmp_path / "export"
    mine = _linked(out, name, tmp_path)
    assert main(["export", "--model", str(tiny_bert), "--out", str(out), "--overwrite"]) == 0
    assert mine.read_text() == "the user's own file\n"
    if (out / name).exists():
        assert not (out / name).is_symlink()


def test_data_export_overwrite_replaces_a_link_in_out(tmp_path):
    out = tmp_path / "data"
    mine = _linked(out, "README.md", tmp_path)
    assert main(["data", "export", "wordnet-attributes", "--out", str(out), "--overwrite"]) == 0
    assert mine.read_text() == "the user's own file\n"
    assert not (out / "README.md").is_symlink() and (out / "README.md").read_text().startswith("# wordnet-attributes")
