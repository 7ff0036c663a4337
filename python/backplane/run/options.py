"""bpl-run's command line: every flag of torchrun's, under its names (dashes or underscores), each checked
and turned into what the job needs; a flag that cannot apply here is refused, naming it and why."""

import argparse
import glob
import os
import signal
import string
import uuid

from .._version import __version__

DEFAULT_MASTER_PORT = 29500  # torchrun's
DEFAULT_C10D_PORT = 29400  # torchrun's port of an --rdzv-endpoint that names none
RDZV_CONF_KEYS = ("timeout", "join_timeout", "read_timeout", "last_call_timeout", "close_timeout", "is_host",
                  "use_libuv", "keep_alive_interval", "keep_alive_max_attempt")
PREFIX_MACROS = {"rank": 0, "local_rank": 0, "hostname": "", "role_name": ""}


def build_parser():
    parser = CheckedParser(prog="bpl-run", allow_abbrev=False,
                           description="Start the local ranks of a backplane job, with torchrun's flags and variables.")
    add = parser.add_argument

    def flag(name, **kwargs):
        """A flag under torchrun's two spellings: --nproc-per-node and --nproc_per_node."""
        names = [name] + ([name.replace("-", "_").replace("__", "--", 1)] if "-" in name[2:] else [])
        add(*names, dest=name[2:].replace("-", "_"), **kwargs)

    add("--version", action="version", version="%(prog)s (backplane) " + __version__)
    flag("--nnodes", default="1", help="nodes in the job, N or MIN:MAX (default 1)")
    flag("--nproc-per-node", default="1",
         help="ranks on this node: a number, cpu (one per CPU), gpu or auto (one per accelerator, else per CPU)")
    flag("--rdzv-backend", default="static", choices=("static", "c10d"),
         help="static: --node-rank says each node's place (default); c10d: nodes meet at --rdzv-endpoint")
    flag("--rdzv-endpoint", default="", help="HOST[:PORT] where nodes meet (default: --master-addr:--master-port)")
    flag("--rdzv-id", default="none", help="the job's name (TORCHELASTIC_RUN_ID, the log folder's)")
    flag("--rdzv-conf", default="", help="KEY=VALUE,... of the rendezvous (timeout, last_call_timeout, ...)")
    add("--standalone", action="store_true", help="one node, on a free port")
    flag("--max-restarts", type=int, default=0, help="restarts of the ranks after a failure before failing (default 0)")
    flag("--monitor-interval", type=float, default=0.1, help="seconds between looks at the ranks (default 0.1)")
    flag("--start-method", default="spawn", choices=("spawn", "fork", "forkserver"),
         help="accepted as torchrun does: a program always starts as a process of its own")
    flag("--event-log-handler", default="null", choices=("null", "console"),
         help="console: the job's events (start, failure, restart, end) on stderr; null: none (default)")
    flag("--role", default="default", help="the ranks' role (ROLE_NAME; default 'default')")
    add("-m", "--module", action="store_true", help="run the program as a Python module (python -m)")
    flag("--no-python", action="store_true", help="run the program as it is, even a .py script")
    flag("--run-path", action="store_true", help="run the script with runpy.run_path (a Python script, any path)")
    flag("--log-dir", default=None, help="the folder of the ranks' log and error files (default: a new temporary one)")
    add("-r", "--redirects", default="0", type=stream_choice,
        help="streams written to log files instead of the console: 0 none, 1 stdout, 2 stderr, 3 both, or per "
             "local rank (0:1,1:2)")
    add("-t", "--tee", default="0", type=stream_choice, help="streams written to log files and the console")
    flag("--log-line-prefix-template", default=None,
         help="what precedes a rank's console lines: ${rank}, ${local_rank}, ${role_name}, ${hostname} are filled in "
              "(default [rank${rank}]: when the job has more than one rank; \"\" for none)")
    flag("--local-ranks-filter", default="", help="only these local ranks' lines on the console (0,1,...)")
    flag("--duplicate-stdout-filters", default="",
         help="stdout lines holding one of these words (a,b; ',,' for a comma) also go to filtered_stdout.log")
    flag("--duplicate-stderr-filters", default="", help="the same for stderr (filtered_stderr.log)")
    flag("--node-rank", type=int, default=0, help="this node's place, 0..nnodes-1 (static rendezvous)")
    flag("--master-addr", default=None, help="the first node's host (default: $MASTER_ADDR or 127.0.0.1)")
    flag("--master-port", type=int, default=None,
         help=f"the job's port on the first node (default: $MASTER_PORT, {DEFAULT_MASTER_PORT} with several nodes, "
              "a free one on one node), where the job's store serves")
    flag("--local-addr", default=None, help="this node's address as the others reach it (default: its host name)")
    flag("--logs-specs", default=None, help="torchrun's LogsSpecs plugin: not applicable (bpl-run's layout is torchrun's)")
    flag("--numa-binding", default=None, choices=("node", "socket", "exclusive", "core-complex"),
         help="torchrun's binding near each rank's GPU: not applicable without GPUs (see --bind-to)")
    flag("--signals-to-handle", default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
         help="signals passed on to every rank (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)")
    add("--shutdown-timeout", "--shutdown_timeout", "--term-timeout", type=float, default=None, dest="shutdown_timeout",
         help="seconds between SIGTERM and SIGKILL when stopping ranks (default $TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 5)")
    flag("--virtual-local-rank", action="store_true",
         help="LOCAL_RANK 0 for every rank, each seeing only its own GPU (CUDA_VISIBLE_DEVICES)")
    flag("--print-completion", default=None, choices=("bash", "zsh", "tcsh"), help="not provided by bpl-run")
    # backplane's own.
    flag("--bind-to", choices=("none", "core"), default="none",
         help="core: each local rank on its own share of the CPUs (as mpirun); none: anywhere (default)")
    flag("--keep-going", action="store_true",
         help="when a rank fails, let the others go on instead of stopping them (docs/faults.md)")
    add("--replace", action="store_true",
        help="--keep-going, and start a newcomer (BPL_JOIN=1) in a failed rank's place, once per local rank")
    add("program", help="the program: a .py script, a module with -m, or any executable")
    add("args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


class CheckedParser(argparse.ArgumentParser):
    def error(self, message):
        # argparse reports an unknown flag before the program as a missing program: name the flag instead.
        unknown = [word for word in getattr(self, "argv", []) if word.startswith("-") and word != "--"
                   and word.split("=", 1)[0] not in self._option_string_actions]
        if "required" in message and unknown:
            message = f"unrecognized flag {unknown[0]} (bpl-run --help lists the flags)"
        super().error(message)


def parse_args(argv):
    parser = build_parser()
    parser.argv = list(argv)
    args = parser.parse_args(argv)

    def refuse(message):
        parser.error(message)

    args.keep_going = args.keep_going or args.replace
    args.min_nodes, args.max_nodes = node_range(args.nnodes, refuse)
    args.nproc_per_node = local_world_size(args.nproc_per_node, refuse)
    if not 0 <= args.node_rank < args.max_nodes:
        refuse(f"--node-rank {args.node_rank}: expected 0..{args.max_nodes - 1}")
    if args.master_port is not None and not 1 <= args.master_port <= 65534:
        refuse(f"--master-port {args.master_port}: expected 1..65534 (the Neuron backend takes the next one)")
    if args.standalone and args.max_nodes != 1:
        refuse(f"--standalone runs a single node, and --nnodes {args.nnodes} asks for more: drop one of them")
    if args.rdzv_backend == "static" and args.min_nodes != args.max_nodes:
        refuse(f"--nnodes {args.nnodes} with --rdzv-backend static: a static rendezvous has a fixed number of "
               "nodes (a range needs --rdzv-backend c10d)")
    if args.max_restarts < 0:
        refuse(f"--max-restarts {args.max_restarts}: expected 0 or more")
    if args.max_restarts > 0 and args.max_nodes > 1 and args.rdzv_backend == "static":
        refuse(f"--max-restarts {args.max_restarts} with --nnodes {args.nnodes} and a static rendezvous: the nodes "
               "cannot agree on a restart without meeting (--rdzv-backend c10d --rdzv-endpoint HOST:PORT)")
    if args.keep_going and args.rdzv_backend == "c10d" and args.max_nodes > 1:
        refuse("--keep-going or --replace with --rdzv-backend c10d across nodes: the rendezvous stops every node's "
               "ranks when one fails (a static rendezvous lets them go on)")
    if args.max_restarts > 0 and args.keep_going:
        refuse(f"--max-restarts {args.max_restarts} and --{'replace' if args.replace else 'keep-going'} exclude "
               "each other: a failure restarts every rank, or the others go on")
    if args.monitor_interval <= 0:
        refuse(f"--monitor-interval {args.monitor_interval:g}: expected seconds above 0")
    args.rdzv_conf = rendezvous_conf(args.rdzv_conf, refuse)
    args.endpoint = endpoint(args, refuse)
    if args.endpoint[1] is None and args.rdzv_id == "none":  # one node on a free port: named anew, as torchrun does
        args.rdzv_id = str(uuid.uuid4())
    args.shutdown_timeout = shutdown_timeout(args.shutdown_timeout, refuse)
    args.signals = signals_to_handle(args.signals_to_handle, refuse)
    args.local_ranks_filter = ranks_filter(args.local_ranks_filter, args.nproc_per_node, refuse)
    args.stdout_filters = word_filters(args.duplicate_stdout_filters)
    args.stderr_filters = word_filters(args.duplicate_stderr_filters)
    if args.logs_specs is not None:
        refuse(f"--logs-specs {args.logs_specs}: torchrun's LogsSpecs plugins are torch classes; bpl-run writes "
               "torchrun's default layout (--log-dir, --tee, --redirects)")
    if args.numa_binding is not None:
        refuse(f"--numa-binding {args.numa_binding}: binds each rank near its GPU, and bpl-run's ranks have none; "
               "--bind-to core gives each rank CPUs of its own")
    if args.print_completion is not None:
        refuse(f"--print-completion {args.print_completion}: bpl-run has no completion script")
    if args.run_path and args.module:
        refuse("--run-path and -m exclude each other: --run-path runs a script file")
    if args.module and args.no_python:
        refuse("-m and --no-python exclude each other: a module runs with Python")
    if args.log_line_prefix_template is None:
        args.log_line_prefix_template = os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
    if args.log_line_prefix_template is None:
        args.log_line_prefix_template = "[rank${rank}]:" if args.nproc_per_node * args.max_nodes > 1 else ""
    try:
        string.Template(args.log_line_prefix_template).substitute(PREFIX_MACROS)
    except (KeyError, ValueError) as error:
        refuse(f"--log-line-prefix-template {args.log_line_prefix_template!r}: {error}; expected ${{rank}}, "
               "${local_rank}, ${role_name} or ${hostname}")
    for name in ("redirects", "tee"):
        for local_rank in getattr(args, name):
            if local_rank != "*" and local_rank >= args.nproc_per_node:
                refuse(f"--{name} names local rank {local_rank}: expected 0..{args.nproc_per_node - 1}")
    cpus = len(os.sched_getaffinity(0))
    if args.bind_to == "core" and args.nproc_per_node > cpus:
        refuse(f"--bind-to core with --nproc-per-node {args.nproc_per_node}: only {cpus} CPU(s) here; expected at "
               "most one rank per CPU (or --bind-to none)")
    return args


def node_range(text, refuse):
    """--nnodes N or MIN:MAX, as (min, max)."""
    parts = text.split(":")
    if len(parts) > 2 or not all(part.strip().isdigit() for part in parts):
        refuse(f"--nnodes {text}: expected a number of nodes, or MIN:MAX")
    low, high = int(parts[0]), int(parts[-1])
    if not 0 < low <= high:
        refuse(f"--nnodes {text}: expected 1 <= MIN <= MAX")
    return low, high


def local_world_size(text, refuse):
    """--nproc-per-node: a number, or what this node has (torchrun's cpu, gpu, xpu and auto)."""
    if text.strip().isdigit():
        if int(text) < 1:
            refuse(f"--nproc-per-node {text}: expected at least 1")
        return int(text)
    cpus = len(os.sched_getaffinity(0))
    if text == "cpu":
        return cpus
    if text in ("gpu", "xpu", "auto"):
        devices = accelerators(text)
        if devices:
            return devices
        if text == "auto":
            return cpus
        refuse(f"--nproc-per-node {text}: this node has no {text.upper()} (--nproc-per-node cpu starts one rank per CPU)")
    refuse(f"--nproc-per-node {text}: expected a number, cpu, gpu, xpu or auto")


def accelerators(kind):
    """How many devices of `kind` this node has: Neuron devices (auto), else torch's count of GPUs (or XPUs),
    where torch is installed."""
    if kind == "auto":
        neuron = glob.glob("/dev/neuron[0-9]*")
        if neuron:
            return len(neuron)
    try:
        import torch
    except ImportError:
        return 0
    if kind in ("gpu", "auto") and torch.cuda.is_available():
        return torch.cuda.device_count()
    if kind in ("xpu", "auto") and hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.xpu.device_count()
    return 0


def rendezvous_conf(text, refuse):
    conf = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            refuse(f"--rdzv-conf {text}: {pair!r} is not KEY=VALUE")
        if key.strip() not in RDZV_CONF_KEYS:
            refuse(f"--rdzv-conf {text}: unknown key {key.strip()!r}; expected one of {', '.join(RDZV_CONF_KEYS)}")
        if key.strip().endswith(("timeout", "interval")):
            try:
                if float(value) < 0:
                    raise ValueError
            except ValueError:
                refuse(f"--rdzv-conf {text}: {key.strip()}={value.strip()!r}; expected seconds, 0 or more")
        conf[key.strip()] = value.strip()
    return conf


def endpoint(args, refuse):
    """(host, port or None) where the nodes meet: --rdzv-endpoint, else --master-addr and --master-port."""
    if args.standalone:
        return "127.0.0.1", None
    if args.rdzv_endpoint:
        host, colon, port = args.rdzv_endpoint.strip().rpartition(":")
        if not colon:
            host, port = args.rdzv_endpoint.strip(), str(DEFAULT_C10D_PORT)
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65533:
            refuse(f"--rdzv-endpoint {args.rdzv_endpoint}: expected HOST:PORT with PORT 0..65533 (0: a free one)")
        if args.master_addr is not None or args.master_port is not None:
            refuse("--rdzv-endpoint and --master-addr/--master-port both say where the job meets: give one")
        return host, int(port) or None
    host = args.master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = args.master_port
    if port is None and os.environ.get("MASTER_PORT"):
        text = os.environ["MASTER_PORT"]
        if not text.isdigit() or not 1 <= int(text) <= 65534:
            refuse(f"MASTER_PORT={text}: expected 1..65534 (the Neuron backend takes the next one)")
        port = int(text)
    if port is None and args.max_nodes > 1:
        port = DEFAULT_MASTER_PORT
    return host, port


def shutdown_timeout(value, refuse):
    if value is None:
        text = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
        try:
            value = float(text) if text else 5.0
        except ValueError:
            refuse(f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT={text}: expected seconds")
    if value < 0:
        refuse(f"--shutdown-timeout {value:g}: expected 0 or more seconds")
    return value


def signals_to_handle(text, refuse):
    chosen = []
    for name in filter(None, (n.strip() for n in text.split(","))):
        number = getattr(signal, name, None)
        if not isinstance(number, signal.Signals) or number in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            refuse(f"--signals-to-handle {text}: {name} is not a signal bpl-run can pass on (such as SIGUSR1)")
        chosen.append(number)
    return chosen


def ranks_filter(text, nproc, refuse):
    if not text:
        return None
    try:
        ranks = {int(r) for r in text.split(",")}
    except ValueError:
        refuse(f"--local-ranks-filter {text}: expected local ranks separated by commas (0,1)")
    outside = sorted(r for r in ranks if not 0 <= r < nproc)
    if outside:
        refuse(f"--local-ranks-filter {text}: local rank {outside[0]} is not in 0..{nproc - 1}")
    return ranks


def word_filters(text):
    """torchrun's filter list: words separated by commas, ',,' for a comma within one."""
    return [word.replace("\0", ",") for word in text.replace(",,", "\0").split(",") if word]


def stream_choice(text):
    """--redirects/--tee: 0-3 for every local rank, or local_rank:value pairs."""
    def value(v):
        if v not in ("0", "1", "2", "3"):
            raise argparse.ArgumentTypeError(f"{v!r}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)")
        return int(v)
    if ":" not in text:
        return {"*": value(text)}
    choice = {}
    for pair in text.split(","):
        rank, _, v = pair.partition(":")
        if not rank.strip().isdigit():
            raise argparse.ArgumentTypeError(f"{pair!r}: expected local_rank:value, such as 0:3")
        choice[int(rank)] = value(v.strip())
    return choice


def streams_for(choice, local_rank):
    """(stdout, stderr) of a --redirects or --tee choice for one local rank."""
    v = choice.get(local_rank, choice.get("*", 0))
    return bool(v & 1), bool(v & 2)
