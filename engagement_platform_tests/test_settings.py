"""The settings, their reference and the Definitions' resources agree, with no server involved: every default
docs/reference/configuration.md documents is what load_settings() gives with the variable unset, every
documented variable is read, and the resources of the Definitions resolve their config with every EP_* and
storage variable removed (as under a `dagster dev` started by hand), following the settings at run time."""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

import pytest
from dagster import Definitions

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.settings import DECLARED, REPO_ROOT, SETTINGS, load_settings

REFERENCE = REPO_ROOT / "docs" / "reference" / "configuration.md"
PACKAGE = REPO_ROOT / "engagement_platform"
# Every variable family the platform or its libraries read for the platform's services.
ENV_PREFIXES = ("EP_", "KAFKA_", "SPARK_", "ZOOKEEPER_", "AWS_", "AZURE_")
CADENCE_STREAMS = ("ingestion", "mutation", "retention", "profile_cdc", "profile_erasure")


@pytest.fixture
def bare_environment(monkeypatch):
    """The environment with every setting and storage variable removed (restored after the test)."""
    import os

    for name in list(os.environ):
        if name.startswith(ENV_PREFIXES) or name in DECLARED:
            monkeypatch.delenv(name)


def documented_defaults() -> dict[str, str]:
    """Variable -> default, for every row of the reference that shows one (`unset` rows have none)."""
    return dict(re.findall(r"^\| `([A-Z0-9_]+)` \| `([^`]*)` \|", REFERENCE.read_text(), re.MULTILINE))


def resolved(defaults: dict[str, str]) -> dict[str, str]:
    """The documented defaults as values of the environment: `<repo>` is this checkout, `$EP_STATE_DIR` the
    documented state folder."""
    state_dir = defaults["EP_STATE_DIR"].replace("<repo>", str(REPO_ROOT))
    return {
        name: value.replace("<repo>", str(REPO_ROOT)).replace("$EP_STATE_DIR", state_dir)
        for name, value in defaults.items()
    }


def other_value(value: str) -> str:
    """A valid value unlike `value`: a number plus one, a duration one unit longer, on -> off, text extended."""
    if value.isdigit():
        return str(int(value) + 1)
    if re.fullmatch(r"\d+[smhd]", value):
        return f"{int(value[:-1]) + 1}{value[-1]}"
    return {"on": "off", "shared": "per-run"}.get(value, value + "-other")


def comparable(settings):
    """Settings with the raw cadence variables replaced by the cadences they give every stream."""
    cadences = tuple(settings.cadence(stream) for stream in CADENCE_STREAMS)
    return replace(settings, batch_cadence_env={}), cadences


def test_the_reference_shows_every_declared_default():
    documented = documented_defaults()
    declared = {s.name: s.default for s in SETTINGS if s.default is not None and "<" not in s.name}
    shown = {
        name: default.replace("{repo}", "<repo>").replace("{EP_STATE_DIR}", "$EP_STATE_DIR")
        for name, default in declared.items()
    }
    assert documented == shown
    assert documented["EP_ZK_ROOT"] == "/engagement_platform"


def test_with_every_variable_unset_load_settings_gives_the_documented_defaults(bare_environment):
    documented = resolved(documented_defaults())
    unset = load_settings()
    assert comparable(load_settings(documented)) == comparable(unset)
    assert unset.zookeeper_root == documented["EP_ZK_ROOT"]
    assert unset.zookeeper_hosts == documented["ZOOKEEPER_HOSTS"]
    assert unset.kafka_bootstrap_servers == documented["KAFKA_BOOTSTRAP_SERVERS"]
    assert unset.spark_remote == documented["SPARK_REMOTE"]
    assert unset.lake_root == documented["EP_LAKE_ROOT"] == str(REPO_ROOT / ".state" / "lake")
    assert unset.zookeeper_auth is None and unset.erasure.secret_is_default and unset.storage_options == {}


@pytest.mark.parametrize("name", sorted(documented_defaults()))
def test_every_documented_variable_is_read(name, bare_environment):
    """Setting a documented variable to another value changes the settings: the reference names nothing the
    code ignores."""
    unset = comparable(load_settings())
    value = resolved(documented_defaults())[name]
    assert comparable(load_settings({name: other_value(value)})) != unset


def test_a_relative_lake_folder_is_made_absolute_on_the_driver(bare_environment, tmp_path, monkeypatch):
    """Spark tasks resolve paths in their own working directory (a worker's folder on a cluster): the
    driver hands them absolute ones. A URI is kept as given."""
    monkeypatch.chdir(tmp_path)
    assert load_settings({"EP_LAKE_ROOT": "lake"}).lake_root == str(tmp_path / "lake")
    assert DeltaLake("lake").uri("t") == str(tmp_path / "lake" / "t")
    assert load_settings({"EP_LAKE_ROOT": "s3://bucket/lake"}).lake_root == "s3://bucket/lake"
    assert DeltaLake("s3://bucket/lake/").root == "s3://bucket/lake"


def test_an_empty_value_is_the_default_except_where_empty_means_something(bare_environment):
    assert load_settings({"EP_ZK_ROOT": "", "EP_ERASURE_WINDOW": ""}) == load_settings()
    assert load_settings({"SPARK_REMOTE": ""}).spark_remote == ""  # a classic in-process session


def test_every_ep_variable_the_package_names_is_declared():
    """A name in the package's own EP_ namespace (a string literal such as "EP_FAILPOINT") that the reference
    does not list is a setting nobody can find."""
    named = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"EP_[A-Z0-9_]*[A-Z0-9]", node.value):
                    named.add(node.value)
    assert named - set(DECLARED) == set()


def test_the_definitions_resources_resolve_their_config_with_the_environment_unset(bare_environment, monkeypatch):
    """What a sensor tick or a run does first: resolve each resource's config. An `EnvVar` field whose variable
    is unset fails there (DagsterInvalidConfigError) on every tick; an empty field takes the setting instead,
    read when the resource is used, so a variable set later is followed. Nothing connects: the coordinator's
    setup (which opens its ZooKeeper session) is left out."""
    from engagement_platform.definitions import defs
    from engagement_platform.resources import CoordinatorResource

    monkeypatch.setattr(CoordinatorResource, "setup_for_execution", lambda self, context: None)
    Definitions.validate_loadable(defs)
    defs.get_repository_def()
    assert set(defs.resources) == {"spark", "lake", "kafka", "coordinator"}

    def initialized(name: str, check) -> None:
        with defs.resources[name].process_config_and_initialize_cm() as resource:
            check(resource, load_settings())

    def coordinator_follows(resource, settings) -> None:
        assert resource.is_enabled and resource.predecessor_wait_bound_s == settings.max_predecessor_wait_seconds
        zk = resource.coordinator()  # a kazoo client, not started
        assert (zk.hosts, zk.root) == (settings.zookeeper_hosts, settings.zookeeper_root)

    initialized("spark", lambda resource, settings: None)
    initialized("lake", lambda resource, settings: assert_equal(resource.lake.root, settings.lake_root))
    initialized("kafka", lambda resource, settings: assert_equal(resource.servers, settings.kafka_bootstrap_servers))
    initialized("coordinator", coordinator_follows)

    monkeypatch.setenv("EP_ZK_ROOT", "/another_lake")
    monkeypatch.setenv("EP_LAKE_ROOT", str(Path("/tmp") / "another_lake"))
    initialized("lake", lambda resource, settings: assert_equal(resource.lake.root, "/tmp/another_lake"))
    initialized("coordinator", lambda resource, settings: assert_equal(resource.coordinator().root, "/another_lake"))


def assert_equal(actual, expected) -> None:
    assert actual == expected
