"""Browser origins (`cors_origins`) are checked once (engine/origins.py): the config loader refuses a bad one from
the command line or the settings file with a ConfigError naming where it came from; the Settings panel uses the
same check."""
from __future__ import annotations

import pytest

from engine.config import ConfigError, load
from engine.origins import check_origins

BAD = ["not a url", "http://localhost:3000/app", "localhost:3000", "http://localhost:99999", "http://a.example,",
       "http://user@a.example"]


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_origin_on_the_command_line_fails_at_load(tmp_path, bad):
    cfg = tmp_path / "llamadesk.toml"
    cfg.write_text("")
    with pytest.raises(ConfigError) as e:
        load(["--config", str(cfg), "--cors-origins", bad])
    assert str(e.value) == f"invalid value for --cors-origins (cli): {check_origins(bad)}"
    assert check_origins(bad) is not None


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_origin_in_the_settings_file_fails_at_load(tmp_path, bad):
    cfg = tmp_path / "llamadesk.toml"
    cfg.write_text(f'cors_origins = "{bad}"\n')
    with pytest.raises(ConfigError) as e:
        load(["--config", str(cfg)])
    assert str(e.value) == f"invalid value for 'cors_origins' (toml): {check_origins(bad)}"
    assert check_origins(bad) is not None


def test_a_bad_file_value_fails_even_where_a_flag_overrides_it_and_a_good_flag_loads(tmp_path):
    cfg = tmp_path / "llamadesk.toml"
    good = "http://localhost:3000, https://app.example.org:8443, *"
    cfg.write_text('cors_origins = "not a url"\n')
    with pytest.raises(ConfigError, match="'cors_origins' \\(toml\\)"):  # as a bad value of any key does
        load(["--config", str(cfg), "--cors-origins", good])
    cfg.write_text("")
    assert load(["--config", str(cfg), "--cors-origins", good]).cors_origins == good
    with pytest.raises(ConfigError, match="--cors-origins \\(cli\\)"):
        load(["--config", str(cfg), "--cors-origins", "http://ok.example, not a url"])


@pytest.mark.parametrize("good", ["*", "http://localhost:3000", "https://app.example.org", "http://[::1]:8080",
                                  "http://127.0.0.1:3000, http://b.example", "app://llamadesk"])
def test_good_origins_load(tmp_path, good):
    cfg = tmp_path / "llamadesk.toml"
    cfg.write_text(f'cors_origins = "{good}"\n')
    assert load(["--config", str(cfg)]).cors_origins == good


def test_the_settings_panel_checks_origins_with_the_same_function():
    pytest.importorskip("PySide6")
    from app.gui.panels import settings
    assert settings.CHECKS["cors_origins"] is check_origins
