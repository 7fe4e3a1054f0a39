"""The docs keep up with the code: every setting is in docs/configuration.md with its variable
and default, and the README links every page under docs/."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from gateway.settings import ENV_PREFIX, Settings, sections, variables

ROOT = Path(__file__).resolve().parents[1]


def field_of(name: str) -> FieldInfo:
    """The field a variable (less the prefix, lower case) sets: of ``Settings``, or of one of
    its sections."""
    path = variables()[name]
    if len(path) == 1:
        return Settings.model_fields[path[0]]
    return sections()[path[0]].model_fields[path[1]]


def documented_default(field_name: str) -> str:
    """The default as the table shows it: `value`, or a word for secrets and empty strings."""
    field = field_of(field_name)
    default = field.default
    if default is None and field.annotation in (SecretStr | None,):
        # ensure_secrets generates these two; other optional secrets stay off when unset.
        return "generated" if field_name in ("admin_key", "key_pepper") else "unset"
    if default == "":
        return "empty"
    if isinstance(default, Path) and not default.is_absolute():
        return f"`./{default}`"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    return f"`{default}`"


def table_rows() -> dict[str, str]:
    text = (ROOT / "docs" / "configuration.md").read_text()
    rows = {}
    for match in re.finditer(r"^\| `(SWITCHYARD_[A-Z0-9_]+)` \| ([^|]+) \|", text, re.M):
        rows[match.group(1)] = match.group(2).strip()
    return rows


def test_every_setting_is_documented_with_its_default() -> None:
    rows = table_rows()
    missing, wrong = [], []
    for name in variables():
        variable = ENV_PREFIX + name.upper()
        expected = documented_default(name)
        if variable not in rows:
            missing.append(f"| `{variable}` | {expected} | ... |")
        elif rows[variable] != expected:
            wrong.append(f"{variable}: table says {rows[variable]}, code says {expected}")
    assert not missing, "add to docs/configuration.md:\n" + "\n".join(missing)
    assert not wrong, "\n".join(wrong)


def test_no_documented_setting_is_stale() -> None:
    known = {ENV_PREFIX + name.upper() for name in variables()}
    assert set(table_rows()) <= known


def test_readme_links_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in readme, f"README.md does not link docs/{page.name}"
