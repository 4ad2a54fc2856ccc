"""ember.device.entry_points reads the installed plugins' entry points as importlib.metadata would."""
from __future__ import annotations

import importlib.metadata
import pathlib
import sys
import zipfile

import pytest

from ember.device import entry_points as ep_mod


def _as_tuples(eps: list) -> list[tuple[str, str, str, str]]:
    return sorted((e.name, e.value, e.dist.name, e.dist.version) for e in eps)


@pytest.mark.parametrize("group", ["ember.devices", "console_scripts", "pytest11"])
def test_the_installed_entry_points_match_importlib_metadata(group: str):
    ours = ep_mod.entry_points(group)
    assert _as_tuples(ours) == _as_tuples(list(importlib.metadata.entry_points(group=group)))


def _dist(root: pathlib.Path, folder: str, name: str, version: str, entry_points: str) -> None:
    d = root / folder
    d.mkdir(parents=True)
    meta = "METADATA" if folder.endswith(".dist-info") else "PKG-INFO"
    (d / meta).write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nName: not-a-header\n")
    if entry_points:
        (d / "entry_points.txt").write_text(entry_points)


def test_folders_on_sys_path_are_read_and_the_first_of_a_name_wins(tmp_path: pathlib.Path,
                                                                    monkeypatch: pytest.MonkeyPatch):
    first, second = tmp_path / "first", tmp_path / "second"
    _dist(first, "my_plugin-1.0.dist-info", "my-plugin", "1.0",
          "# a comment\n[other]\nx = a:b\n\n[ember.test_group]\nfast = my_plugin.entry:hooks.impl\n")
    _dist(second, "my_plugin-2.0.dist-info", "my-plugin", "2.0", "[ember.test_group]\nshadowed = nope:x\n")
    _dist(second, "dev_thing.egg-info", "dev-thing", "0.3", "[ember.test_group]\ndev = dev_thing\n")
    _dist(second, "no_eps-1.0.dist-info", "no-eps", "1.0", "")
    monkeypatch.setattr(sys, "path", [str(first), str(second), str(tmp_path / "missing")])
    found = ep_mod.entry_points("ember.test_group")
    assert _as_tuples(found) == [("dev", "dev_thing", "dev-thing", "0.3"),
                                 ("fast", "my_plugin.entry:hooks.impl", "my-plugin", "1.0")]
    (first / "ember_ep_test_module.py").write_text("class hooks:\n    impl = 7\n")
    fast = next(e for e in found if e.name == "fast")
    fast.value = "ember_ep_test_module:hooks.impl"
    assert fast.load() == 7 and fast.dist.metadata["Name"] == "my-plugin"
    sys.modules.pop("ember_ep_test_module", None)


def test_a_zip_on_sys_path_is_left_to_importlib_metadata(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: zipped\nVersion: 1.0\n")
        z.writestr("zipped-1.0.dist-info/entry_points.txt", "[ember.test_group]\nz = zipped.plugin\n")
    monkeypatch.setattr(sys, "path", [str(archive)])
    assert ep_mod._scan("ember.test_group") is None
    assert _as_tuples(ep_mod.entry_points("ember.test_group")) == [("z", "zipped.plugin", "zipped", "1.0")]
