"""Hypothesis strategies for fleet documents with every section populated: servers, endpoints
with listed replicas and replicas by count, rollout with a canary, a multi-node group over the
native launcher and one over Ray, monitoring with exporters and Alertmanager, and secrets by
environment variable and by file — with hostile-but-maybe-valid values in every free-text-ish
field (served names, env and args values, head addresses, bind addresses, names, paths).

The documents are data (:func:`tests.support.fleetgen.to_yaml` writes them); the render fuzzer
(``tests/unit/fleet/test_fuzz_render.py``) loads each, and for those the loader accepts reads
every rendered file back and compares it with the document. :data:`SECRET` is the resolver it
renders with: every secret reference gets a generated, hostile value naming the reference.

Example:
    >>> from fleet.spec.models import SecretRef
    >>> secret_value(SecretRef(file="/srv/secrets/key")).endswith("file:/srv/secrets/key")
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import strategies as st

#: Characters that some syntax on the way to a host treats specially, and non-ASCII.
TRICKY = [*" \"'\\$%{}[]#;=`&|<>*?~!,:.@+/()^", "é", "你", "😀", "ß"]
_LETTERS = st.characters(min_codepoint=0x30, max_codepoint=0x7A)
#: Free text as a person may type it into a value that reaches a host.
TEXT = st.text(alphabet=st.one_of(st.sampled_from(TRICKY), _LETTERS), min_size=1, max_size=20)



#: Whether this document is one with odd values: drawn once per document (``st.shared``), so
#: that about half of the documents are plausible throughout (and mostly load) and the other
#: half carry many odd values (and reach the loader's refusals).
ODD_DOCUMENT = st.shared(st.booleans(), key="fleetgen_sections.odd")


def rarely(plain: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``plain``; in a document with odd values (:data:`ODD_DOCUMENT`), ``odd`` one time in
    four."""
    return ODD_DOCUMENT.flatmap(
        lambda odd_doc: st.integers(0, 3).flatmap(
            lambda n: odd if odd_doc and n == 0 else plain))


#: Free text, now and then looking like an option (the loader should refuse those, located).
MAYBE_OPTION = rarely(TEXT, st.one_of(
    TEXT.map(lambda s: "-" + s), st.sampled_from(
        ["--help", "-1", "--trust-remote-code", "x ; +touch PWNED", "$HOME", "%n", "a\\", "\\",
         "a\tb"])))

#: Names: the plain ones, and ones that collide with vllm-fleet's own names or each other
#: after normalisation (the loader may refuse those, located).
HOST_NAMES = ["gpu-a", "gpu-c", "h1", "h2", "gpu-b", "mon", "node.1", "x_y", "box-2", "models",
              "router-chat", "med-ray", "a", "0"]
SERVER_NAMES = ["chat", "s", "med", "med-ray", "models", "router-chat", "x.y", "a_b", "chat-1",
                "big", "s2", "s3"]
INTERFACES = rarely(st.sampled_from(["eth0", "ens8f0", "bond0.100", "ib0"]), TEXT)
#: Addresses a host is reached at.
ADDRESSES = rarely(
    st.ip_addresses(v=4, network="10.0.0.0/8").map(str),
    st.sampled_from(["10.0.0.11", "gpu-a.lan", "fd00::11", "::ffff:10.0.0.11", "10.0.0.011",
                     "127.0.1.1", "10.0.9.1"]))
#: Head addresses of a multi-node group: ordinary, and IPv6 with a hostile zone id (Python's
#: ipaddress lets the zone hold spaces, ``;``, ``+``, ``%``, ``$``).
HEAD_ADDRESSES = rarely(
    st.one_of(st.sampled_from(["10.10.0.1", "fd00::1", "fe80::1%eth0", "head.lan"]),
              st.ip_addresses(v=4, network="10.0.0.0/8").map(str)),
    st.one_of(st.sampled_from(["fe80::1%i --help ; +touch PWNED ; +echo ", "fe80::1%a VLLM_X=1",
                               "fe80::1%$HOME", "fe80::1%50%", "fe80::1%\\", "127.0.0.1"]),
              TEXT.map(lambda zone: "fe80::1%" + zone)),
)
#: Addresses a server binds (``host``): typed ones, and what a careless hand writes there.
BINDS = rarely(st.sampled_from(["0.0.0.0", "::"]), st.sampled_from(
    ["127.0.0.1", "::1", "localhost", "127.0.1.1", "10.0.0.256", "--trust-remote-code",
     "gpu-a.lan", "x y"]))
#: A block of hosts written as one range key (fleet.spec.hostranges): plain ranges, and in odd
#: documents ones the loader refuses (counting down, mixed padding, past the name's length).
RANGE_KEYS = rarely(st.sampled_from(["pool-[1:2]", "pool-[01:03]", "pool-[a:b]", "p[8:12:2]"]),
                    st.sampled_from(["pool-[3:1]", "pool-[01:100]", "pool-[]", "pool-[1-3]",
                                     "pool-[1:2]" + "x" * 60, "h[1:2]", "gpu-[a:c]"]))
#: A range block's address: its first host's (perhaps inside a network), or a name per host;
#: in odd documents one that runs out of its network or gives every host one name.
RANGE_ADDRESSES = rarely(
    st.one_of(st.ip_addresses(v=4, network="10.200.0.0/16").map(str),
              st.sampled_from(["10.201.0.1/24", "fd00::200", "{name}.pool.lan"])),
    st.sampled_from(["10.201.0.254/24", "pool.lan", "10.201.0.0/24", "{name}.{x}", "sandbox",
                     "10.0.0.11"]))
#: tests/data/inventories/site.ini, a site's Ansible inventory, and what its group ``gpus``
#: gives each host (written here from the file, not by the loader).
SITE_INVENTORY = str(Path(__file__).resolve().parents[1] / "data" / "inventories" / "site.ini")
SITE_GPUS = {**{f"gpu-0{n}": {"address": f"gpu-0{n}", "ssh": {"user": "ops"}} for n in range(1, 5)},
             "big-1": {"address": "10.0.5.1", "ssh": {"port": 2222}}}
#: Secret files: ordinary, and ones the deploy must never read.
SECRET_FILES = st.sampled_from(["/srv/secrets/key", "~/secrets/api-key", "/etc/shadow",
                                "/proc/self/environ", "/dev/zero",
                                "~/secrets/../../../root/.ssh/id_ed25519"])
ENV_NAMES = st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: n not in {"HOME", "TMPDIR", "HF_HOME"} and not any(
        word in n for word in ("TOKEN", "KEY", "SECRET", "PASS", "CRED")))
SECRET_REFS = st.one_of(
    st.builds(lambda name: {"env": name}, st.sampled_from(["FLEET_KEY", "FLEET_TOKEN_2"])),
    st.builds(lambda path: {"file": path}, rarely(st.just("/srv/secrets/key"), SECRET_FILES)),
)
FREE_TEXT_FLAGS = ["chat-template", "revision", "code-revision", "tokenizer-revision"]
JSON_FLAGS = ["override-generation-config", "hf-overrides"]
JSON_MAPPING = st.dictionaries(TEXT, st.one_of(TEXT, st.integers(-10**6, 10**6), st.booleans()),
                               max_size=3)

#: Flags that change how a server is reached (its root path), and values; TLS is ``tls``.
REACH_FLAGS = ["root-path"]
REACH_VALUES = {"root-path": ["/api", "/v1/proxy path"]}


@st.composite
def tls_values(draw: Any) -> dict[str, Any]:
    """A server's ``tls``: certificate and key by reference, perhaps a CA the probes trust and
    mutual TLS (a client CA, perhaps ``client_certificates: optional``)."""
    tls = {"certificate": draw(SECRET_REFS), "key": draw(SECRET_REFS)}
    if draw(st.booleans()):
        tls["ca"] = draw(SECRET_REFS)
    if draw(st.booleans()):
        tls["client_ca"] = draw(SECRET_REFS)
        if draw(st.booleans()):
            tls["client_certificates"] = "optional"
    return tls

CPU_MODEL = {"url": "https://models.example/m.tar.gz", "sha256": "ab" * 32}
GPU_MODEL = {
    "hf": "Qwen/Qwen3-8B", "revision": "b968826d9c46dd6066d109eabc6255188de91218",
    "weights_gib": 15.26,
    "config": {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 36,
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
               "hidden_size": 4096, "intermediate_size": 12288, "vocab_size": 151936,
               "max_position_embeddings": 40960, "torch_dtype": "bfloat16"},
}


def secret_value(ref: Any) -> str:
    """The value the render fuzzer's resolver gives a secret reference (hostile on purpose:
    quotes, a backslash, ``$``, ``%``, a blank).

    Example:
        >>> from fleet.spec.models import SecretRef
        >>> secret_value(SecretRef(env="K"))
        'k"3y\\\\ $HOME %n env:K'
    """
    return f'k"3y\\ $HOME %n {"env:" + ref.env if ref.env else "file:" + ref.file}'


@st.composite
def server_values(draw: Any, model: str, tls: bool = False) -> dict[str, Any]:
    """The free parts of a server: served names, args, env (text and secrets), api key, and
    with ``tls`` (not a replica of an endpoint: refused there) perhaps TLS."""
    server: dict[str, Any] = {"model": model}
    if draw(st.booleans()):
        server["served_model_name"] = draw(st.one_of(
            MAYBE_OPTION, st.lists(TEXT, min_size=1, max_size=3, unique=True)))
    args: dict[str, Any] = {"max-model-len": draw(st.integers(64, 4096))}
    for flag in draw(st.lists(st.sampled_from(FREE_TEXT_FLAGS), unique=True, max_size=2)):
        args[flag] = draw(MAYBE_OPTION)
    for flag in draw(st.lists(st.sampled_from(JSON_FLAGS), unique=True, max_size=1)):
        args[flag] = draw(JSON_MAPPING)
    server["args"] = args
    env: dict[str, Any] = draw(st.dictionaries(ENV_NAMES, st.one_of(TEXT, st.integers(0, 10**6)),
                                               max_size=2))
    if draw(st.booleans()):
        env["HF_TOKEN"] = draw(SECRET_REFS)
    server["env"] = env
    if draw(st.booleans()):
        server["api_key"] = draw(SECRET_REFS)
    # what changes how the server is reached: TLS, a root path
    for flag in draw(st.lists(st.sampled_from(REACH_FLAGS), unique=True, max_size=2)):
        args[flag] = draw(st.sampled_from(REACH_VALUES[flag]))
    if tls and draw(st.booleans()):
        server["tls"] = draw(tls_values())
    return server


@st.composite
def sectioned_fleets(draw: Any) -> dict[str, Any]:
    """A fleet document with every section: three CPU hosts (the monitoring host and two that
    serve), optionally a pair of GPU hosts; servers; a native group across the two CPU hosts;
    a Ray group across the GPU pair; one endpoint of listed replicas and one by count, each
    with a router, rollout and canary; half the time monitoring with exporters and
    Alertmanager; TLS servers (not replicas); half the time a range of CPU hosts
    (``pool-[01:03]``) with a server each."""
    ports = iter(draw(st.lists(st.integers(1024, 65000), min_size=40, max_size=40,
                               unique=True)))  # fmt: skip
    gpu = draw(st.booleans())
    names = draw(st.lists(st.sampled_from(HOST_NAMES), min_size=5 if gpu else 3,
                          max_size=5 if gpu else 3, unique=True))
    mon, a, b = names[:3]
    # Servers may have TLS, monitored or not (Prometheus scrapes them over https).
    monitored = draw(st.booleans())
    tls = True
    models: dict[str, Any] = {"m": CPU_MODEL}
    hosts: dict[str, Any] = {}
    addresses = draw(st.lists(ADDRESSES, min_size=len(names), max_size=len(names), unique=True))
    for index, name in enumerate(names[:3]):
        address = addresses[index]
        hosts[name] = {"address": address, "vllm": {"version": "0.32.0", "variant": "cpu"},
                       "servers": {}}
    # One listed replica on each serving host, and perhaps an extra server of hostile values.
    served = draw(st.one_of(st.just(None), MAYBE_OPTION))
    key = draw(st.one_of(st.none(), SECRET_REFS))
    listed = draw(st.sampled_from(SERVER_NAMES))
    for name in (a, b):
        server = draw(server_values("m"))
        server["served_model_name"] = served
        server["api_key"] = key
        server = {k: v for k, v in server.items() if v is not None}
        server.update(port=next(ports), host=draw(BINDS))
        hosts[name]["servers"][listed] = server
    extra = draw(st.sampled_from(SERVER_NAMES))
    if extra != listed and draw(st.booleans()):
        server = draw(server_values("m", tls=tls))
        server.update(port=next(ports), host=draw(BINDS))
        hosts[a]["servers"][extra] = server
    # A native group: a is the head, b its worker (the CPU build, pipeline parallel).
    group = draw(st.sampled_from([n for n in SERVER_NAMES if n not in (listed, extra)]))
    server = draw(server_values("m", tls=tls))
    server["args"].update({"pipeline-parallel-size": 2, "enforce-eager": True})
    server.update(port=next(ports), host=draw(BINDS), worker_hosts=[b])
    multinode: dict[str, Any] = {"launcher": "native", "master_port": next(ports),
                                 "join_timeout": draw(st.integers(10, 7200))}
    if draw(st.integers(0, 3)):
        multinode["head_address"] = draw(HEAD_ADDRESSES)
    if draw(st.booleans()):
        multinode["interface"] = draw(INTERFACES)
    server["multinode"] = multinode
    hosts[a]["servers"][group] = server
    if draw(rarely(st.just(False), st.just(True))):  # a second group, the same worker host
        second = dict(server, port=next(ports),
                      multinode=dict(server["multinode"], master_port=next(ports)))
        hosts[mon]["servers"][group] = second
    if gpu:
        models["q"] = GPU_MODEL
        g1, g2 = names[3:5]
        for name in (g1, g2):
            hosts[name] = {"address": addresses[names.index(name)],
                           "vllm": {"version": "0.32.0", "variant": "cu129"},
                           "gpus": {"count": 1, "model": "L40S"},
                           "os": {"nvidia": {"driver": "570"}}, "servers": {}}
        ray = draw(st.sampled_from(SERVER_NAMES))
        server = draw(server_values("q", tls=tls))
        server["args"].update({"pipeline-parallel-size": 2})
        server.update(port=next(ports), host=draw(BINDS), gpus=[0], worker_hosts=[g2])
        multinode = {"launcher": "ray", "ray_port": next(ports),
                     "ray_node_manager_port": next(ports),
                     "ray_object_manager_port": next(ports),
                     "join_timeout": draw(st.integers(10, 7200))}
        low = draw(st.integers(20000, 60000))
        multinode.update(ray_min_worker_port=low, ray_max_worker_port=low + 99)
        multinode["head_address"] = draw(HEAD_ADDRESSES)
        if draw(st.booleans()):
            multinode["interface"] = draw(INTERFACES)
        server["multinode"] = multinode
        hosts[g1]["servers"][ray] = server
        if draw(rarely(st.just(False), st.just(True))):  # named as the Ray head's unit
            twin = {"model": "q", "port": next(ports), "host": "0.0.0.0", "gpus": [0]}
            hosts[g1]["servers"][f"{ray}-ray"] = twin
    endpoints: dict[str, Any] = {}
    chat = draw(st.sampled_from(["chat", "med", "e.1", "models", listed.removeprefix("router-")
                                 if listed.startswith("router-") else "chat"]))
    endpoints[chat] = {
        "replicas": [f"{a}/{listed}", f"{b}/{listed}"],
        "router": _router(draw, ports, draw(st.sampled_from([a, mon])), key),
        "rollout": {"max_unavailable": 1, "drain_timeout_s": draw(st.integers(1, 600)),
                    "canary": {"requests": draw(st.integers(1, 16)),
                               "input_len": 128, "output_len": 32,
                               "ttft_margin": 0.25, "tpot_margin": 0.25, "floor_ms": 2}},
    }
    counted = draw(st.sampled_from(["pool", "batch", "x_y"]))
    template = draw(server_values("m"))
    template.pop("api_key", None)
    template.update(port=next(ports), host=draw(BINDS))
    replica_set: dict[str, Any] = {"count": draw(rarely(st.integers(1, 2), st.just(3))),
                                   "server": template}
    if draw(st.booleans()):
        replica_set["hosts"] = draw(rarely(st.sampled_from([[a, b], [b]]),
                                           st.sampled_from([[a, a], []])))
    elif gpu:  # left out, replicas by count go to the GPU hosts: this server is the cpu pool's
        replica_set["hosts"] = [a, b]
    endpoints[counted] = {"replicas": replica_set,
                          "router": _router(draw, ports, draw(st.sampled_from([b, mon])))}
    exporters: dict[str, Any] = {a: {"node_exporter_port": next(ports)}}
    if gpu:
        exporters[names[3]] = {"gpu_metrics": "dcgm", "dcgm_port": next(ports)}
    monitoring = {
        "host": mon,
        "prometheus": {"port": next(ports), "bind": draw(st.sampled_from(
            ["127.0.0.1", "0.0.0.0", "::1", "::"]))},
        "alertmanager": {"port": next(ports)},
        "node_exporter_port": next(ports),
        "exporters": exporters,
        "thresholds": {"gpu_memory_percent": draw(st.integers(50, 99))},
    }
    if draw(st.booleans()):  # a range of CPU hosts, each serving one model (and monitored)
        server = draw(server_values("m"))
        server.update(port=next(ports), host=draw(BINDS))
        hosts[draw(RANGE_KEYS)] = {"address": draw(RANGE_ADDRESSES),
                                   "vllm": {"version": "0.32.0", "variant": "cpu"},
                                   "servers": {draw(st.sampled_from(SERVER_NAMES)): server}}
    if draw(st.integers(0, 3)) == 0:  # the group gpus of the site's Ansible inventory
        server = draw(server_values("m"))
        server.update(port=next(ports), host=draw(BINDS))
        hosts["gpus"] = {"inventory": SITE_INVENTORY,
                         "vllm": {"version": "0.32.0", "variant": "cpu"},
                         "servers": {draw(st.sampled_from(SERVER_NAMES)): server}}
    for host in hosts.values():
        host["os"] = {**host.get("os", {}), **draw(os_values(gpu="gpus" in host))}
    document = {"version": 1, "models": models, "hosts": hosts, "endpoints": endpoints}
    return {**document, "monitoring": monitoring} if monitored else document


#: Kernel parameters the generator sets, with plain values (odd documents add odd ones).
SYSCTLS = {"vm.swappiness": st.integers(0, 100), "net.core.somaxconn": st.integers(128, 65535),
           "fs.file-max": st.integers(65536, 2097152),
           "net.ipv4.ip_local_port_range": st.just("32768 60999")}


@st.composite
def os_values(draw: Any, gpu: bool) -> dict[str, Any]:
    """A host's ``os`` section (the stack under vLLM): CUDA toolkit, CPU governor, kernel
    parameters, the vLLM units' open-file limit; on GPU hosts the driver's exact version and
    persistence. Mostly plausible, odd in the odd documents."""
    out: dict[str, Any] = {}
    if gpu and draw(st.booleans()):
        out["cuda"] = draw(rarely(st.sampled_from(["12.8", "12.9", "13.0"]), TEXT))
    if draw(st.booleans()):
        out["cpu_governor"] = draw(rarely(
            st.sampled_from(["performance", "powersave", "schedutil"]), TEXT))
    if draw(st.booleans()):
        keys = draw(st.lists(st.sampled_from(sorted(SYSCTLS)), unique=True, max_size=3))
        out["sysctl"] = {key: draw(rarely(SYSCTLS[key], st.one_of(TEXT, st.just("on"))))
                         for key in keys}
    if draw(st.booleans()):
        out["nofile"] = draw(rarely(st.integers(1024, 1048576), st.integers(-5, 2_000_000)))
    if gpu and draw(st.booleans()):
        out["nvidia"] = {"driver": draw(rarely(st.sampled_from(["570", "570.172.08"]), TEXT)),
                         "persistence": draw(st.booleans())}
    return out


def _router(draw: Any, ports: Any, host: str, key: Any = None) -> dict[str, Any]:
    router: dict[str, Any] = {"host": host, "port": next(ports), "metrics_port": next(ports),
                              "bind": draw(rarely(st.sampled_from(["0.0.0.0", "::"]),
                                                  st.just("127.0.0.1"))),
                              "policy": draw(st.sampled_from(["round_robin", "power_of_two"]))}
    if key is not None:
        router["api_key"] = key
    return router
