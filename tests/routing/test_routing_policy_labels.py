"""Provider, model, alias and task names are recorded with every usage event: a policy that
names one with a control character is refused (the usage store would refuse every event of
it), naming the section, and ordinary Unicode names still load."""

from __future__ import annotations

import pytest
import yaml

from gateway.policy import PolicyError, parse_policy


@pytest.mark.parametrize("section", ["providers", "models", "aliases", "tasks"])
def test_a_name_with_a_control_character_is_refused(policy_data, section: str) -> None:
    data = policy_data()
    first = next(iter(data[section]))
    data[section]["tab\tname"] = data[section][first]
    if section == "providers":
        data["models"]["big"]["provider"] = "tab\tname"
    with pytest.raises(PolicyError) as refused:
        parse_policy(yaml.safe_dump(data))
    assert refused.value.path.startswith(section), refused.value.path
    assert "control characters" in refused.value.message


def test_a_printable_unicode_model_name_loads(policy_data) -> None:
    data = policy_data()
    data["models"]["modèle 漢"] = data["models"]["big"]
    assert "modèle 漢" in parse_policy(yaml.safe_dump(data)).models
