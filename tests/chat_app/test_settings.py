"""Paths and user settings."""

from __future__ import annotations

from pathlib import Path

import platformdirs
import pytest

from app import settings
from app.errors import DraftpenError, SettingsError
from app.settings import Settings, load_settings, save_settings


def test_draftpen_home_holds_config_data_and_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTPEN_HOME", str(tmp_path))
    monkeypatch.delenv("DRAFTPEN_MODELS_DIR")
    assert settings.config_dir() == tmp_path / "config"
    assert settings.data_dir() == tmp_path / "data"
    assert settings.cache_dir() == tmp_path / "cache"
    assert settings.models_dir() == tmp_path / "data" / "models"
    assert settings.settings_path() == tmp_path / "config" / "settings.toml"


def test_models_dir_override_wins_over_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTPEN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", str(tmp_path / "store"))
    assert settings.models_dir() == tmp_path / "store"
    assert settings.data_dir() == tmp_path / "home" / "data"


def test_without_overrides_paths_follow_the_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRAFTPEN_HOME")
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", "")  # empty counts as unset
    assert settings.config_dir() == platformdirs.user_config_path("draftpen", appauthor=False)
    assert settings.models_dir() == (
        platformdirs.user_data_path("draftpen", appauthor=False) / "models"
    )


def test_paths_are_not_created_by_asking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTPEN_HOME", str(tmp_path / "home"))
    settings.config_dir()
    settings.models_dir()
    assert not (tmp_path / "home").exists()


def test_no_settings_file_means_defaults() -> None:
    assert load_settings() == Settings()
    assert Settings().default_pair == "starter"
    assert Settings().drafter == "auto"


def test_settings_file_values_are_loaded(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    path.write_text(
        'temperature = 1\ntop_k = 0\ndrafter = "ngram"\nsystem_prompt = "Be brief."\n'
        "exact_output = true\n"
    )
    loaded = load_settings(path)
    assert loaded.temperature == 1.0
    assert isinstance(loaded.temperature, float)
    assert loaded.top_k == 0
    assert loaded.drafter == "ngram"
    assert loaded.system_prompt == "Be brief."
    assert loaded.exact_output is True and Settings().exact_output is False
    assert loaded.max_tokens == Settings().max_tokens


def test_settings_are_read_from_the_config_dir(draftpen_home: Path) -> None:
    (draftpen_home / "config").mkdir()
    (draftpen_home / "config" / "settings.toml").write_text('default_pair = "smollm2"\n')
    assert load_settings().default_pair == "smollm2"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("temprature = 0.5\n", "unknown setting(s) temprature"),
        ("top_k = 4.5\n", "top_k must be an integer"),
        ("max_tokens = true\n", "max_tokens must be an integer"),
        ('temperature = "hot"\n', "temperature must be a number"),
        ("exact_output = 1\n", "exact_output must be true or false"),
        (
            'drafter = "psychic"\n',
            "drafter must be one of auto, model, mtp, eagle3, dflash, dspark, ngram, none",
        ),
        ("top_p = 0\n", "top_p must be above 0"),
        # The sampler refuses 1 (it would keep no token): settings say so at once.
        ("min_p = 1\n", "min_p must be 0 or more and under 1"),
        ("temperature = -0.1\n", "temperature must be 0 or more"),
        ("temperature = 0.5\ntemperature = 0.6\n", "Cannot read settings file"),
        ("[section\n", "Cannot read settings file"),
    ],
)
def test_bad_settings_file_names_the_file_and_the_problem(
    tmp_path: Path, text: str, fragment: str
) -> None:
    path = tmp_path / "settings.toml"
    path.write_text(text)
    with pytest.raises(SettingsError) as caught:
        load_settings(path)
    message = str(caught.value)
    assert fragment in message
    assert str(path) in message
    assert "\n" not in message
    assert isinstance(caught.value, DraftpenError)


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Settings().temperature = 2.0  # type: ignore[misc]


def test_a_failed_save_says_so_and_leaves_the_previous_settings_intact(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    save_settings(Settings(temperature=0.2), path)
    # The scratch file's name is taken by a directory: writing it fails, as on a full disk.
    (tmp_path / ".settings.toml.tmp").mkdir()
    with pytest.raises(SettingsError, match="previous settings are unchanged"):
        save_settings(Settings(temperature=0.9), path)
    assert load_settings(path).temperature == 0.2
