"""Static checks of the CustomResourceDefinitions we ship and the test-only CRDs of foreign job kinds.

Covers manifests/crds (Queue, QueueUnit, ElasticQuota, ElasticQuotaProfile and their kustomization)
and tests/crds (TFJob, PyTorchJob, PaddleJob, XGBoostJob, JAXJob, MPIJob, JobSet, RayJob, RayCluster,
Workflow, SparkApplication). No cluster is needed: the files are parsed with PyYAML and checked against the
apiextensions.k8s.io/v1 rules that a kube-apiserver would enforce on creation (structural schema,
list-map keys, protected groups, CEL placement) and against the Koord-Queue API contract (names,
short names, printer columns, field names and validation).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names

REPO = Path(__file__).resolve().parents[2]
PRODUCT_CRD_DIR = REPO / "manifests" / "crds"
TEST_CRD_DIR = REPO / "tests" / "crds"

# The resource.Quantity pattern every ResourceList value must carry.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

VALID_TYPES = {"object", "array", "string", "integer", "number", "boolean"}
VALID_FORMATS = {"int32", "int64", "float", "double", "byte", "date", "date-time", "duration"}
ROOT_FIELDS = {"apiVersion", "kind", "metadata", "spec", "status"}

Schema = dict[str, Any]
SchemaPath = tuple[str, ...]


def load_crds(directory: Path) -> dict[str, dict[str, Any]]:
    """Every CRD in `directory`, keyed by file name (the kustomization is not a CRD)."""
    crds: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        assert len(documents) == 1, f"{path.name}: expected exactly one YAML document"
        crds[path.name] = documents[0]
    return crds


PRODUCT_CRDS = load_crds(PRODUCT_CRD_DIR)
TEST_CRDS = load_crds(TEST_CRD_DIR)
ALL_CRDS = {
    **{f"manifests/{k}": v for k, v in PRODUCT_CRDS.items()},
    **{f"tests/{k}": v for k, v in TEST_CRDS.items()},
}


def crd_by_name(name: str) -> dict[str, Any]:
    for crd in ALL_CRDS.values():
        if crd["metadata"]["name"] == name:
            return crd
    raise KeyError(name)


def version_schema(crd: dict[str, Any], version: str | None = None) -> Schema:
    versions = crd["spec"]["versions"]
    chosen = versions[0] if version is None else next(v for v in versions if v["name"] == version)
    schema: Schema = chosen["schema"]["openAPIV3Schema"]
    return schema


def walk(node: Schema, path: SchemaPath = ()) -> Iterator[tuple[SchemaPath, Schema]]:
    """Yield every schema node with its path; `[]` marks array items and `{}` map values."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, (*path, name))
    additional = node.get("additionalProperties")
    if isinstance(additional, dict):
        yield from walk(additional, (*path, "{}"))
    if "items" in node:
        yield from walk(node["items"], (*path, "[]"))


def at(schema: Schema, dotted: str) -> Schema:
    """The node at a dotted path such as `spec.podSet.[].count`."""
    node = schema
    for part in dotted.split("."):
        if part == "[]":
            node = node["items"]
        elif part == "{}":
            node = node["additionalProperties"]
        else:
            node = node["properties"][part]
    return node


def all_schemas() -> Iterator[tuple[str, str, Schema]]:
    for file_name, crd in ALL_CRDS.items():
        for version in crd["spec"]["versions"]:
            yield file_name, version["name"], version["schema"]["openAPIV3Schema"]


SCHEMA_IDS = [f"{file}:{version}" for file, version, _ in all_schemas()]
SCHEMAS = [schema for _, _, schema in all_schemas()]


def fmt(path: SchemaPath) -> str:
    return ".".join(path) or "<root>"


# --- files and names -----------------------------------------------------------------------------


def test_the_expected_crd_files_exist() -> None:
    assert set(PRODUCT_CRDS) == {
        "scheduling.x-k8s.io_queues.yaml",
        "scheduling.x-k8s.io_queueunits.yaml",
        "scheduling.sigs.k8s.io_elasticquotas.yaml",
        "quota.koordinator.sh_elasticquotaprofiles.yaml",
    }
    names = {crd["metadata"]["name"] for crd in TEST_CRDS.values()}
    assert names == {
        "tfjobs.kubeflow.org",
        "pytorchjobs.kubeflow.org",
        "paddlejobs.kubeflow.org",
        "xgboostjobs.kubeflow.org",
        "jaxjobs.kubeflow.org",
        "mpijobs.kubeflow.org",
        "jobsets.jobset.x-k8s.io",
        "rayjobs.ray.io",
        "rayclusters.ray.io",
        "workflows.argoproj.io",
        "sparkapplications.sparkoperator.k8s.io",
    }


def test_kustomization_lists_exactly_the_product_crds() -> None:
    kustomization = yaml.safe_load((PRODUCT_CRD_DIR / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == sorted(PRODUCT_CRDS)


@pytest.mark.parametrize("file_name", sorted(ALL_CRDS))
def test_crd_header_and_names_are_consistent(file_name: str) -> None:
    crd = ALL_CRDS[file_name]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    spec = crd["spec"]
    names = spec["names"]
    assert crd["metadata"]["name"] == f"{names['plural']}.{spec['group']}"
    assert file_name.split("/")[-1] == f"{spec['group']}_{names['plural']}.yaml"
    assert names["plural"] == names["plural"].lower()
    assert names["singular"] == names["kind"].lower()
    assert names["listKind"] == f"{names['kind']}List"
    assert spec["scope"] == "Namespaced"


@pytest.mark.parametrize("file_name", sorted(ALL_CRDS))
def test_exactly_one_storage_version_and_all_served(file_name: str) -> None:
    spec = ALL_CRDS[file_name]["spec"]
    versions = spec["versions"]
    assert [v["storage"] for v in versions].count(True) == 1
    assert all(v["served"] for v in versions)
    assert len({v["name"] for v in versions}) == len(versions)
    if len(versions) > 1:
        # No conversion webhook: every version must share one schema.
        assert spec["conversion"] == {"strategy": "None"}
        first = versions[0]["schema"]
        assert all(v["schema"] == first for v in versions)


@pytest.mark.parametrize("file_name", sorted(ALL_CRDS))
def test_protected_groups_carry_the_api_approval_annotation(file_name: str) -> None:
    crd = ALL_CRDS[file_name]
    group = crd["spec"]["group"]
    protected = any(group == g or group.endswith("." + g) for g in ("k8s.io", "kubernetes.io"))
    annotation = crd["metadata"].get("annotations", {}).get("api-approved.kubernetes.io")
    if protected:
        assert annotation is not None, f"{group} is protected: the apiserver rejects it without approval"
        assert annotation.startswith("unapproved") or re.match(r"^https?://[^/]+/", annotation)
    else:
        assert annotation is None


def test_x_k8s_io_is_not_a_protected_group() -> None:
    # "scheduling.x-k8s.io" ends in "x-k8s.io", not ".k8s.io": no approval annotation is needed.
    assert not "scheduling.x-k8s.io".endswith(".k8s.io")


@pytest.mark.parametrize(
    ("crd_name", "short_names"),
    [
        ("queueunits.scheduling.x-k8s.io", ["qu", "qus"]),
        ("elasticquotas.scheduling.sigs.k8s.io", ["eq", "eqs"]),
        ("elasticquotaprofiles.quota.koordinator.sh", ["eqp"]),
        ("queues.scheduling.x-k8s.io", None),
    ],
)
def test_short_names(crd_name: str, short_names: list[str] | None) -> None:
    assert crd_by_name(crd_name)["spec"]["names"].get("shortNames") == short_names


# --- structural schema rules ---------------------------------------------------------------------


@pytest.mark.parametrize("schema", SCHEMAS, ids=SCHEMA_IDS)
def test_every_schema_node_is_typed(schema: Schema) -> None:
    for path, node in walk(schema):
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, fmt(path)
            assert node.get("anyOf") == [{"type": "integer"}, {"type": "string"}], fmt(path)
            continue
        if node.get("x-kubernetes-preserve-unknown-fields") and "type" not in node:
            continue
        assert node.get("type") in VALID_TYPES, f"{fmt(path)} has no valid type"
        assert "anyOf" not in node and "oneOf" not in node and "allOf" not in node, fmt(path)


@pytest.mark.parametrize("schema", SCHEMAS, ids=SCHEMA_IDS)
def test_keywords_fit_the_node_type(schema: Schema) -> None:
    for path, node in walk(schema):
        where = fmt(path)
        node_type = node.get("type")
        if "properties" in node or "additionalProperties" in node:
            assert node_type == "object", where
        assert not ("properties" in node and "additionalProperties" in node), where
        assert not ("additionalProperties" in node and node.get("x-kubernetes-preserve-unknown-fields")), (
            where
        )
        assert node.get("x-kubernetes-preserve-unknown-fields", True) is True, where
        if "items" in node:
            assert node_type == "array", where
        if node_type == "array":
            assert "items" in node, f"{where}: an array needs an item schema"
        if "format" in node:
            assert node["format"] in VALID_FORMATS, where
            if node["format"] in {"int32", "int64"}:
                assert node_type == "integer", where
            if node["format"] in {"date", "date-time"}:
                assert node_type == "string", where
        for key in ("maxLength", "minLength", "pattern"):
            if key in node and not node.get("x-kubernetes-int-or-string"):
                assert node_type == "string", f"{where}: {key}"
        for key in ("maxItems", "minItems"):
            if key in node:
                assert node_type == "array", f"{where}: {key}"
        if "pattern" in node:
            re.compile(node["pattern"])
        for value in node.get("enum", []):
            assert isinstance(value, str) if node_type == "string" else not isinstance(value, str), where
        for name in node.get("required", []):
            assert name in node.get("properties", {}), f"{where}: required {name} is not declared"


@pytest.mark.parametrize("schema", SCHEMAS, ids=SCHEMA_IDS)
def test_root_has_only_standard_fields_and_a_plain_metadata(schema: Schema) -> None:
    assert schema["type"] == "object"
    assert set(schema["properties"]) <= ROOT_FIELDS
    assert schema["properties"]["apiVersion"] == {"type": "string"}
    assert schema["properties"]["kind"] == {"type": "string"}
    # Only name/generateName may be restricted in root metadata; we restrict nothing.
    assert schema["properties"]["metadata"] == {"type": "object"}


@pytest.mark.parametrize("schema", SCHEMAS, ids=SCHEMA_IDS)
def test_list_map_keys_are_required_or_defaulted_scalars(schema: Schema) -> None:
    for path, node in walk(schema):
        list_type = node.get("x-kubernetes-list-type")
        if list_type is None:
            assert "x-kubernetes-list-map-keys" not in node, fmt(path)
            continue
        assert node["type"] == "array", fmt(path)
        assert list_type in {"atomic", "set", "map"}, fmt(path)
        if list_type != "map":
            assert "x-kubernetes-list-map-keys" not in node, fmt(path)
            continue
        item = node["items"]
        assert item["type"] == "object", fmt(path)
        keys = node["x-kubernetes-list-map-keys"]
        assert keys, fmt(path)
        for key in keys:
            key_schema = item["properties"][key]
            assert key_schema.get("type") in {"string", "integer", "boolean", "number"}, f"{fmt(path)}: {key}"
            assert key in item.get("required", []) or "default" in key_schema, (
                f"{fmt(path)}: list-map key {key} must be required or have a default"
            )


@pytest.mark.parametrize("schema", SCHEMAS, ids=SCHEMA_IDS)
def test_defaults_satisfy_their_own_schema(schema: Schema) -> None:
    for path, node in walk(schema):
        if "default" not in node:
            continue
        value = node["default"]
        if node["type"] == "integer":
            assert isinstance(value, int), fmt(path)
            assert value >= node.get("minimum", value), fmt(path)
        elif node["type"] == "string":
            assert isinstance(value, str), fmt(path)
            assert len(value) <= node.get("maxLength", len(value)), fmt(path)
            if "pattern" in node:
                assert re.search(node["pattern"], value), fmt(path)


@pytest.mark.parametrize("schema", SCHEMAS, ids=SCHEMA_IDS)
def test_cel_rules_sit_under_bounded_lists_only(schema: Schema) -> None:
    """Estimated CEL cost multiplies by every enclosing list's size; unbounded lists blow the budget."""

    def visit(node: Schema, path: SchemaPath, bounded: bool) -> None:
        if node.get("x-kubernetes-validations"):
            assert bounded, f"{fmt(path)}: CEL rule under an array without maxItems"
            for validation in node["x-kubernetes-validations"]:
                assert validation["rule"] and validation["message"], fmt(path)
        for name, child in node.get("properties", {}).items():
            visit(child, (*path, name), bounded)
        if isinstance(node.get("additionalProperties"), dict):
            visit(node["additionalProperties"], (*path, "{}"), bounded=False)
        if "items" in node:
            visit(node["items"], (*path, "[]"), bounded and "maxItems" in node)

    visit(schema, (), bounded=True)


@pytest.mark.parametrize("schema", SCHEMAS, ids=SCHEMA_IDS)
def test_resource_lists_use_the_quantity_pattern(schema: Schema) -> None:
    for path, node in walk(schema):
        if node.get("x-kubernetes-int-or-string"):
            assert path[-1] == "{}", f"{fmt(path)}: only ResourceList values are int-or-string here"
            assert node["pattern"] == QUANTITY_PATTERN, fmt(path)


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("500m", True),
        ("2", True),
        ("1Gi", True),
        ("1.5", True),
        ("1e3", True),
        ("-1", True),
        ("1GB", False),
        ("abc", False),
    ],
)
def test_quantity_pattern_accepts_quantities_only(text: str, valid: bool) -> None:
    assert (re.match(QUANTITY_PATTERN, text) is not None) is valid


@pytest.mark.parametrize("file_name", sorted(ALL_CRDS))
def test_printer_columns_point_at_declared_fields(file_name: str) -> None:
    crd = ALL_CRDS[file_name]
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        for column in version.get("additionalPrinterColumns", []):
            assert column["type"] in {"string", "integer", "number", "boolean", "date"}, column
            path = column["jsonPath"]
            assert path.startswith("."), column
            if path == ".metadata.creationTimestamp":
                assert column["type"] == "date"
                continue
            if path.startswith(".metadata.annotations."):
                # An annotation (metadata has no schema here): a string, named by its key.
                assert column["type"] == "string", column
                continue
            node = at(schema, path[1:])
            if column["type"] == "integer":
                assert node["type"] == "integer", column
            if column["type"] == "date":
                assert node.get("format") == "date-time", column


# --- Queue ---------------------------------------------------------------------------------------

QUEUE = crd_by_name("queues.scheduling.x-k8s.io")
QUEUE_SCHEMA = version_schema(QUEUE)


def test_queue_version_and_status_subresource() -> None:
    (version,) = QUEUE["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}


def test_queue_printer_columns() -> None:
    (version,) = QUEUE["spec"]["versions"]
    columns = [(c["name"], c["jsonPath"], c["type"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("POLICY", ".spec.queuePolicy", "string"),
        ("PRIORITY", ".spec.priority", "integer"),
        ("AGE", ".metadata.creationTimestamp", "date"),
    ]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("spec.queuePolicy", {"type": "string"}),
        ("spec.priority", {"type": "integer", "format": "int32"}),
        ("spec.priorityClassName", {"type": "string"}),
        ("spec.admissionChecks.[].name", {"type": "string"}),
        ("spec.admissionChecks.[].labelSelector.matchLabels.{}", {"type": "string"}),
        ("spec.admissionChecks.[].labelSelector.matchExpressions.[].key", {"type": "string"}),
        ("spec.admissionChecks.[].labelSelector.matchExpressions.[].values.[]", {"type": "string"}),
        ("status.queueItemDetails.{}.[].name", {"type": "string"}),
        ("status.queueItemDetails.{}.[].namespace", {"type": "string"}),
        ("status.queueItemDetails.{}.[].priority", {"type": "integer", "format": "int32"}),
        ("status.queueItemDetails.{}.[].position", {"type": "integer", "format": "int32"}),
    ],
)
def test_queue_fields(path: str, expected: dict[str, str]) -> None:
    node = at(QUEUE_SCHEMA, path)
    assert {k: node[k] for k in expected if k in node} == expected


def test_queue_label_selector_is_atomic_with_required_expression_fields() -> None:
    selector = at(QUEUE_SCHEMA, "spec.admissionChecks.[].labelSelector")
    assert selector["x-kubernetes-map-type"] == "atomic"
    assert sorted(selector["properties"]["matchExpressions"]["items"]["required"]) == ["key", "operator"]


# --- QueueUnit -----------------------------------------------------------------------------------

QUEUE_UNIT = crd_by_name("queueunits.scheduling.x-k8s.io")
QU_SCHEMA = version_schema(QUEUE_UNIT)


def test_queue_unit_names_version_and_subresource() -> None:
    names = QUEUE_UNIT["spec"]["names"]
    assert (names["plural"], names["singular"], names["kind"], names["listKind"]) == (
        "queueunits",
        "queueunit",
        "QueueUnit",
        "QueueUnitList",
    )
    (version,) = QUEUE_UNIT["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_queue_unit_printer_columns_begin_with_upstream_four_in_order() -> None:
    (version,) = QUEUE_UNIT["spec"]["versions"]
    columns = version["additionalPrinterColumns"]
    head = [(c["name"], c["jsonPath"], c["type"], c.get("priority", 0)) for c in columns[:4]]
    assert head == [
        ("PHASE", ".status.phase", "string", 0),
        ("PRIORITY", ".spec.priority", "integer", 0),
        ("ADMISSIONS", ".status.admissions", "string", 0),
        ("JOBTYPE", ".spec.consumerRef.kind", "string", 0),
    ]


def test_queue_unit_default_and_wide_headers() -> None:
    (version,) = QUEUE_UNIT["spec"]["versions"]
    columns = version["additionalPrinterColumns"]
    default = ["NAME"] + [c["name"] for c in columns if c.get("priority", 0) == 0]
    wide = ["NAME"] + [c["name"] for c in columns]
    assert default[:5] == ["NAME", "PHASE", "PRIORITY", "ADMISSIONS", "JOBTYPE"]
    assert default == ["NAME", "PHASE", "PRIORITY", "ADMISSIONS", "JOBTYPE", "AGE"]
    assert wide == ["NAME", "PHASE", "PRIORITY", "ADMISSIONS", "JOBTYPE", "AGE", "QUEUE", "POOL", "MESSAGE"]
    by_name = {c["name"]: c for c in columns}
    assert by_name["QUEUE"]["jsonPath"] == ".spec.queue"
    assert by_name["POOL"]["jsonPath"] == ".status.pool"
    assert by_name["MESSAGE"]["jsonPath"] == ".status.message"
    assert by_name["AGE"] == {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("spec.priority", {"type": "integer", "format": "int32"}),
        ("spec.queue", {"type": "string"}),
        ("spec.priorityClassName", {"type": "string"}),
        ("spec.active", {"type": "boolean"}),
        ("spec.maximumExecutionTimeSeconds", {"type": "integer", "format": "int32"}),
        ("spec.podSet.[].name", {"type": "string", "default": "main", "maxLength": 63}),
        ("spec.podSet.[].count", {"type": "integer", "format": "int32", "default": 1, "minimum": 0}),
        ("spec.podSet.[].minCount", {"type": "integer", "format": "int32", "minimum": 1}),
        ("spec.podSet.[].template", {"type": "object"}),
        ("status.attempts", {"type": "integer", "format": "int64"}),
        ("status.message", {"type": "string"}),
        ("status.lastUpdateTime", {"type": "string", "format": "date-time"}),
        ("status.lastAllocateTime", {"type": "string", "format": "date-time"}),
        ("status.podState.running", {"type": "integer"}),
        ("status.podState.pending", {"type": "integer"}),
        ("status.admissions.[].name", {"type": "string"}),
        ("status.admissions.[].replicas", {"type": "integer", "format": "int64"}),
        ("status.admissions.[].running", {"type": "integer", "format": "int64"}),
        ("status.admissions.[].reclaimState.replicas", {"type": "integer", "format": "int64"}),
        ("status.admissionChecks.[].name", {"type": "string", "maxLength": 316}),
        ("status.admissionChecks.[].lastTransitionTime", {"type": "string", "format": "date-time"}),
        ("status.admissionChecks.[].message", {"type": "string", "maxLength": 32768}),
        ("status.admissionChecks.[].podSetUpdates.[].name", {"type": "string"}),
        ("status.admissionChecks.[].podSetUpdates.[].labels.{}", {"type": "string"}),
        ("status.admissionChecks.[].podSetUpdates.[].annotations.{}", {"type": "string"}),
        ("status.admissionChecks.[].podSetUpdates.[].nodeSelector.{}", {"type": "string"}),
        ("status.admissionChecks.[].podSetUpdates.[].tolerations", {"type": "array", "maxItems": 8}),
        ("status.conditions.[].observedGeneration", {"type": "integer", "format": "int64"}),
        ("status.conditions.[].lastTransitionTime", {"type": "string", "format": "date-time"}),
        ("status.requeueState.count", {"type": "integer", "format": "int32"}),
        ("status.requeueState.requeueAt", {"type": "string", "format": "date-time"}),
        ("status.reclaimablePods.[].name", {"type": "string"}),
        ("status.reclaimablePods.[].count", {"type": "integer", "format": "int32"}),
        ("status.accumulatedPastExecutionTimeSeconds", {"type": "integer", "format": "int32"}),
    ],
)
def test_queue_unit_fields(path: str, expected: dict[str, Any]) -> None:
    node = at(QU_SCHEMA, path)
    assert {k: node[k] for k in expected if k in node} == expected


def test_queue_unit_consumer_ref_is_an_atomic_object_reference() -> None:
    ref = at(QU_SCHEMA, "spec.consumerRef")
    assert ref["x-kubernetes-map-type"] == "atomic"
    assert set(ref["properties"]) == {
        "apiVersion",
        "kind",
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "fieldPath",
    }
    assert all(child == {"type": "string"} for child in ref["properties"].values())


@pytest.mark.parametrize("path", ["spec.resource", "spec.request", "status.admissions.[].resources"])
def test_queue_unit_resource_lists(path: str) -> None:
    node = at(QU_SCHEMA, path)
    assert node["type"] == "object"
    assert node["additionalProperties"]["x-kubernetes-int-or-string"] is True


def test_queue_unit_pod_set_is_a_bounded_list_map_with_the_min_count_rule() -> None:
    pod_set = at(QU_SCHEMA, "spec.podSet")
    assert (pod_set["minItems"], pod_set["maxItems"]) == (1, 8)
    assert pod_set["x-kubernetes-list-type"] == "map"
    assert pod_set["x-kubernetes-list-map-keys"] == ["name"]
    item = pod_set["items"]
    assert sorted(item["required"]) == ["count", "template"]
    assert item["x-kubernetes-validations"] == [
        {
            "rule": "has(self.minCount) ? self.minCount <= self.count : true",
            "message": "minCount should be positive and less or equal to count",
        }
    ]
    name_pattern = item["properties"]["name"]["pattern"]
    assert re.search(name_pattern, "worker-0")
    assert not re.search(name_pattern, "Worker")
    assert not re.search(name_pattern, "my.job")


def test_queue_unit_pod_template_keeps_metadata_and_spec_unpruned() -> None:
    template = at(QU_SCHEMA, "spec.podSet.[].template")
    for part in ("metadata", "spec"):
        assert template["properties"][part] == {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }


def test_queue_unit_status_requires_nothing_so_partial_merge_patches_work() -> None:
    assert "required" not in at(QU_SCHEMA, "status")
    assert "required" not in QU_SCHEMA


def test_queue_unit_phase_enum() -> None:
    assert at(QU_SCHEMA, "status.phase")["enum"] == [
        "Enqueued",
        "Reserved",
        "Dequeued",
        "Running",
        "Succeed",
        "Failed",
        "SchedReady",
        "SchedSucceed",
        "SchedFailed",
        "TimeoutBackoff",
        "Preempted",
    ]


@pytest.mark.parametrize(
    ("path", "key", "max_items", "required"),
    [
        ("status.admissionChecks", "name", 8, ["lastTransitionTime", "message", "name", "state"]),
        ("status.admissions", "name", 32, ["name", "replicas", "running"]),
        ("status.conditions", "type", 8, ["lastTransitionTime", "message", "reason", "status", "type"]),
        ("status.reclaimablePods", "name", 32, ["count", "name"]),
    ],
)
def test_queue_unit_status_list_maps(path: str, key: str, max_items: int, required: list[str]) -> None:
    node = at(QU_SCHEMA, path)
    assert node["x-kubernetes-list-type"] == "map"
    assert node["x-kubernetes-list-map-keys"] == [key]
    assert node["maxItems"] == max_items
    assert sorted(node["items"]["required"]) == required


def test_queue_unit_admission_check_state_and_pod_set_updates() -> None:
    check = at(QU_SCHEMA, "status.admissionChecks.[]")
    assert check["properties"]["state"]["enum"] == ["Pending", "Ready", "Retry", "Rejected"]
    updates = check["properties"]["podSetUpdates"]
    assert updates["maxItems"] == 8
    assert updates["items"]["required"] == ["name"]
    assert at(QU_SCHEMA, "status.admissions.[].reclaimState")["required"] == ["replicas"]


def test_queue_unit_conditions_follow_metav1_condition() -> None:
    condition = at(QU_SCHEMA, "status.conditions.[]")["properties"]
    assert condition["status"]["enum"] == ["True", "False", "Unknown"]
    assert (condition["reason"]["minLength"], condition["reason"]["maxLength"]) == (1, 1024)
    for reason in ("Deactivated", "BackoffTimeout", "Preempted", "MaximumExecutionTimeExceeded", "Admitted"):
        assert re.search(condition["reason"]["pattern"], reason)
    for condition_type in ("QuotaReserved", "Admitted", "PodsReady", "Finished", "Evicted"):
        assert re.search(condition["type"]["pattern"], condition_type)


# --- ElasticQuota --------------------------------------------------------------------------------

ELASTIC_QUOTA = crd_by_name("elasticquotas.scheduling.sigs.k8s.io")
EQ_SCHEMA = version_schema(ELASTIC_QUOTA)


def test_elastic_quota_resource_lists_and_columns() -> None:
    (version,) = ELASTIC_QUOTA["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    for path in ("spec.min", "spec.max", "status.used"):
        assert at(EQ_SCHEMA, path)["additionalProperties"]["x-kubernetes-int-or-string"] is True
    columns = version["additionalPrinterColumns"]
    default = [c["name"] for c in columns if c.get("priority", 0) == 0]
    assert default == ["MIN", "MAX", "USED", "BORROWED", "AGE"]
    wide = [c["name"] for c in columns if c.get("priority", 0) == 1]
    assert wide == ["RUNTIME"]
    # The annotations the reconciler publishes (shared.core.quotastatus), keys escaped for JSONPath.
    paths = {c["name"]: c["jsonPath"] for c in columns}
    escaped = {
        key: ".metadata.annotations." + key.replace(".", "\\.")
        for key in (names.QUOTA_BORROWED_ANNOTATION, names.QUOTA_RUNTIME_ANNOTATION)
    }
    assert paths["BORROWED"] == escaped[names.QUOTA_BORROWED_ANNOTATION]
    assert paths["RUNTIME"] == escaped[names.QUOTA_RUNTIME_ANNOTATION]


# --- ElasticQuotaProfile ------------------------------------------------------------------------

PROFILE = crd_by_name("elasticquotaprofiles.quota.koordinator.sh")
PROFILE_SCHEMA = version_schema(PROFILE)


def test_elastic_quota_profile_version_columns_and_open_status() -> None:
    """docs/pools.md#pools-are-elasticquotaprofiles: Koordinator's kind, with our columns."""
    (version,) = PROFILE["spec"]["versions"]
    assert (PROFILE["spec"]["group"], version["name"]) == ("quota.koordinator.sh", "v1alpha1")
    assert version["subresources"] == {"status": {}}
    columns = [(c["name"], c["jsonPath"], c["type"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("QUOTA", ".spec.quotaName", "string"),
        ("RATIO", ".spec.resourceRatio", "string"),
        ("AGE", ".metadata.creationTimestamp", "date"),
    ]
    assert at(PROFILE_SCHEMA, "status") == {
        "description": at(PROFILE_SCHEMA, "status")["description"],
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("spec.quotaName", {"type": "string"}),
        ("spec.resourceRatio", {"type": "string"}),
        ("spec.quotaLabels.{}", {"type": "string"}),
        ("spec.nodeSelector.matchLabels.{}", {"type": "string"}),
        ("spec.nodeSelector.matchExpressions.[].key", {"type": "string"}),
        ("spec.nodeSelector.matchExpressions.[].operator", {"type": "string"}),
        ("spec.nodeSelector.matchExpressions.[].values.[]", {"type": "string"}),
    ],
)
def test_elastic_quota_profile_fields(path: str, expected: dict[str, str]) -> None:
    node = at(PROFILE_SCHEMA, path)
    assert {k: node[k] for k in expected if k in node} == expected


def test_elastic_quota_profile_requires_its_quota_name_and_keeps_the_selector_atomic() -> None:
    assert at(PROFILE_SCHEMA, "spec")["required"] == ["quotaName"]
    selector = at(PROFILE_SCHEMA, "spec.nodeSelector")
    assert selector["x-kubernetes-map-type"] == "atomic"
    assert sorted(selector["properties"]["matchExpressions"]["items"]["required"]) == ["key", "operator"]


# --- test-only CRDs of foreign job kinds ---------------------------------------------------------

# Fields the job adapters read or write, per CRD; each must be declared in the test CRD.
FOREIGN_FIELDS = {
    "tfjobs.kubeflow.org": [
        "spec.runPolicy.suspend",
        "spec.tfReplicaSpecs.{}.replicas",
        "spec.tfReplicaSpecs.{}.template",
        "status.conditions.[].type",
        "status.startTime",
    ],
    "pytorchjobs.kubeflow.org": [
        "spec.runPolicy.suspend",
        "spec.pytorchReplicaSpecs.{}.replicas",
        "spec.pytorchReplicaSpecs.{}.template",
        "status.conditions.[].type",
        "status.startTime",
    ],
    "mpijobs.kubeflow.org": [
        "spec.runPolicy.suspend",
        "spec.mpiReplicaSpecs.{}.replicas",
        "spec.mpiReplicaSpecs.{}.template",
        "status.conditions.[].type",
        "status.conditions.[].status",
    ],
    "jobsets.jobset.x-k8s.io": [
        "spec.suspend",
        "spec.replicatedJobs.[].name",
        "spec.replicatedJobs.[].replicas",
        "spec.replicatedJobs.[].template.spec.parallelism",
        "spec.replicatedJobs.[].template.spec.completions",
        "spec.replicatedJobs.[].template.spec.template",
        "status.terminalState",
        "status.conditions.[].type",
        "status.conditions.[].status",
        "status.replicatedJobsStatus.[].active",
    ],
    "rayjobs.ray.io": [
        "spec.suspend",
        "spec.rayClusterSpec.headGroupSpec.template",
        "spec.rayClusterSpec.workerGroupSpecs.[].groupName",
        "spec.rayClusterSpec.workerGroupSpecs.[].replicas",
        "spec.rayClusterSpec.workerGroupSpecs.[].template",
        "status.jobDeploymentStatus",
    ],
    "rayclusters.ray.io": [
        "spec.headGroupSpec.template",
        "spec.workerGroupSpecs.[].groupName",
        "spec.workerGroupSpecs.[].replicas",
        "spec.workerGroupSpecs.[].template",
    ],
    "workflows.argoproj.io": [
        "spec.suspend",
        "spec.templates.[].name",
        "spec.templates.[].suspend",
        "status.nodes.{}.type",
        "status.nodes.{}.phase",
        "status.conditions.[].type",
        "status.conditions.[].status",
        "status.storedTemplates.{}.suspend",
    ],
    "sparkapplications.sparkoperator.k8s.io": [
        "spec.mode",
        "spec.driver.cores",
        "spec.driver.memory",
        "spec.executor.instances",
        "spec.executor.cores",
        "spec.executor.coreRequest",
        "spec.executor.coreLimit",
        "spec.executor.memory",
        "spec.executor.memoryOverhead",
        "spec.dynamicAllocation.initialExecutors",
        "spec.batchSchedulerOptions.priorityClassName",
        "status.applicationState.state",
    ],
}


@pytest.mark.parametrize(("crd_name", "paths"), sorted(FOREIGN_FIELDS.items()))
def test_foreign_crds_declare_the_fields_we_use(crd_name: str, paths: list[str]) -> None:
    crd = crd_by_name(crd_name)
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        for path in paths:
            at(schema, path)


@pytest.mark.parametrize("file_name", sorted(TEST_CRDS))
def test_foreign_crds_prune_nothing(file_name: str) -> None:
    """Every declared object keeps unknown fields, so the foreign controllers' fields survive."""
    for version in TEST_CRDS[file_name]["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        for path, node in walk(schema):
            if not path or path == ("metadata",):
                continue
            if node.get("type") == "object" and "additionalProperties" not in node:
                assert node.get("x-kubernetes-preserve-unknown-fields") is True, f"{file_name}: {fmt(path)}"


@pytest.mark.parametrize("file_name", sorted(TEST_CRDS))
def test_foreign_crds_status_subresource(file_name: str) -> None:
    crd = TEST_CRDS[file_name]
    for version in crd["spec"]["versions"]:
        if crd["metadata"]["name"] == "workflows.argoproj.io":
            # Argo's real CRD has no status subresource; status is written through the main resource.
            assert version["subresources"] == {}
        else:
            assert version["subresources"] == {"status": {}}


def test_ray_job_serves_v1_and_v1alpha1_and_stores_v1() -> None:
    versions = {v["name"]: v for v in crd_by_name("rayjobs.ray.io")["spec"]["versions"]}
    assert set(versions) == {"v1", "v1alpha1"}
    assert versions["v1"]["storage"] is True
    assert versions["v1alpha1"]["storage"] is False


@pytest.mark.parametrize(
    ("crd_name", "version"),
    [
        ("tfjobs.kubeflow.org", "v1"),
        ("pytorchjobs.kubeflow.org", "v1"),
        ("mpijobs.kubeflow.org", "v2beta1"),
        ("jobsets.jobset.x-k8s.io", "v1alpha2"),
        ("rayclusters.ray.io", "v1"),
        ("workflows.argoproj.io", "v1alpha1"),
        ("sparkapplications.sparkoperator.k8s.io", "v1beta2"),
    ],
)
def test_foreign_crd_versions(crd_name: str, version: str) -> None:
    assert [v["name"] for v in crd_by_name(crd_name)["spec"]["versions"]] == [version]
