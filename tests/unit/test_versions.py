"""The core and every plugin distribution move in lockstep: one version, pinned exactly."""
from __future__ import annotations

import configparser
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLUGIN_CFGS = sorted(ROOT.glob("plugins/*/setup.cfg"))


def read_cfg(path: pathlib.Path) -> configparser.ConfigParser:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(path, encoding="utf-8")
    return cfg


def requirement_lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip() and not line.strip().startswith("#")]


CORE = read_cfg(ROOT / "setup.cfg")
VERSION = CORE["metadata"]["version"]


def test_core_metadata() -> None:
    assert CORE["metadata"]["name"] == "ember"
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)
    assert (ROOT / "pyproject.toml").is_file()  # needed for editable installs


def test_package_version_matches_setup_cfg() -> None:
    import ember

    assert ember.__version__ == VERSION


def test_there_is_at_least_one_plugin() -> None:
    assert PLUGIN_CFGS, "no plugins/*/setup.cfg found"


@pytest.mark.parametrize("cfg_path", PLUGIN_CFGS, ids=lambda p: p.parent.name)
def test_plugin_version_and_pin(cfg_path: pathlib.Path) -> None:
    cfg = read_cfg(cfg_path)
    name = cfg["metadata"]["name"]
    assert name.startswith("ember-"), name
    assert cfg["metadata"]["version"] == VERSION, f"{name} is {cfg['metadata']['version']}, core is {VERSION}"
    requires = requirement_lines(cfg["options"]["install_requires"])
    core_pins = [r for r in requires if re.match(r"ember\s*[=<>!~;\[]|ember$", r)]
    assert core_pins == [f"ember=={VERSION}"], f"{name} must pin ember=={VERSION}, has {core_pins}"
    assert "ember.devices" in cfg["options.entry_points"], f"{name} declares no ember.devices entry point"
    assert (cfg_path.parent / "pyproject.toml").is_file(), f"{name} needs a pyproject.toml for editable installs"


def test_core_extras_pin_plugins_at_the_core_version() -> None:
    plugin_names = {read_cfg(p)["metadata"]["name"] for p in PLUGIN_CFGS}
    for extra, value in CORE["options.extras_require"].items():
        for requirement in requirement_lines(value):
            match = re.match(r"(ember-[a-z0-9_-]+)\s*(.*)", requirement)
            if match is None:
                continue
            dist, spec = match.groups()
            assert spec.split(";")[0].strip() == f"=={VERSION}", f"extra [{extra}]: {requirement}"
            assert dist in plugin_names, f"extra [{extra}] names {dist}, which has no plugins/*/setup.cfg"
