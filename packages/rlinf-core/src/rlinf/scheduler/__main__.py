"""``python -m rlinf.scheduler plugins``: list discovered plugins (launchers, transports,
accelerators) and whether each is usable.  ``python -m rlinf.scheduler status``: groups,
workers and channels of the running cluster (see ``status``)."""

from __future__ import annotations

import argparse
import sys
import warnings


def _plugins() -> int:
    from .plugins import get_registry

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # failures are printed below, once
        registry = get_registry()
    rows = [("NAME", "KIND", "DISTRIBUTION", "VERSION", "PRIORITY", "USABLE", "REASON")]
    for p in sorted(registry.all_provided(), key=lambda p: (p.kind, -p.descriptor.priority, p.name)):
        reason = p.unusable_reason() or _absent(p)
        extra = _details(p)
        rows.append((p.name, p.kind + extra, p.source.distribution, p.source.version, str(p.descriptor.priority),
                     "no" if reason else "yes", reason or ""))
    for s in registry.failures():
        rows.append((s.entry_point, "broken", s.distribution, s.version, "-", "no", s.error.splitlines()[0]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    if not registry.autoload:
        print("(plugin autoloading is off: RLINF_PLUGINS_AUTOLOAD=0)")
    return 0


def _absent(p) -> str:
    """Why an installed accelerator kind is of no use on this machine: it has none of its devices."""
    if p.kind != "accelerator":
        return ""
    try:
        return "" if int(p.descriptor.device_count()) > 0 else "no such device on this machine"
    except Exception as exc:
        return f"cannot count its devices: {type(exc).__name__}: {exc}"


def _details(p) -> str:
    d = p.descriptor
    if p.kind == "transport":
        return f" devices={','.join(d.devices)}"
    if p.kind == "accelerator":
        try:
            here = int(d.device_count())
        except Exception as exc:
            here = f"? ({type(exc).__name__})"
        return (f" ray={d.ray_resource} env={d.visible_devices_env} torch={d.torch_device_type} "
                f"backend={d.collective_backend} here={here}")
    return ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlinf.scheduler")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plugins", help="list launcher, transport and accelerator plugins and whether each is usable here")
    st = sub.add_parser("status", help="groups, workers (current calls) and channels of the running cluster "
                                       "(RAY_ADDRESS, or an MPI job of this user on this machine)")
    st.add_argument("--json", action="store_true", help="print JSON instead of tables")
    st.add_argument("--timeout", type=float, default=5.0, help="seconds the command may take (default 5)")
    st.add_argument("--launcher", default=None, help="ask only this launcher plugin (default: every usable one)")
    st.add_argument("--pid", type=int, default=None,
                    help="the program (its process id) whose embedded cluster to show, where several run on this "
                         "machine (default: the newest; the others are named)")
    args = parser.parse_args(argv)
    if args.command == "plugins":
        return _plugins()
    if args.command == "status":
        from .tools import status

        return status.main(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
