"""``edgert service install|uninstall|status``: run a pipeline as a systemd service."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("service", help="install, remove or inspect a pipeline's systemd service")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    inst = sub.add_parser("install", help="render a systemd unit for a pipeline config and enable it")
    inst.add_argument("--config", required=True, help="pipeline YAML the service runs")
    inst.add_argument("--name", required=True, help="service name: the unit is edgert-NAME.service")
    inst.add_argument("--user", default="edgert", help="user the service runs as; created if missing (default: edgert)")
    inst.add_argument("--unit-dir", default=None, help="where to write the unit (default: /etc/systemd/system)")
    inst.add_argument("--env-file", default=None, help="environment file (default: /etc/edgert/NAME.env)")
    inst.add_argument("--edgert", default=None, help="absolute path of the edgert command (default: this one)")
    inst.add_argument("--metrics", default=None, metavar="HOST:PORT", help="serve Prometheus metrics there")
    inst.add_argument("--watchdog-sec", type=int, default=30, help="restart when no frame for this long (default 30)")
    inst.add_argument("--no-start", action="store_true", help="enable the service but do not start it now")
    inst.add_argument("--dry-run", action="store_true", help="print the unit and change nothing")
    inst.set_defaults(func=run)

    for action, text in (("uninstall", "stop, disable and remove a pipeline's service"),
                         ("status", "show a pipeline service's state")):
        q = sub.add_parser(action, help=text)
        q.add_argument("--name", required=True, help="service name given to install")
        q.add_argument("--unit-dir", default=None, help="where the unit was written (default: /etc/systemd/system)")
        q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgert.service import install as svc

    unit_dir = args.unit_dir or svc.SYSTEM_UNIT_DIR
    if args.action == "install":
        if args.metrics:
            from edgert.service.metrics import parse_listen

            parse_listen(args.metrics)  # a bad HOST:PORT fails here, not at the service's first start
        plan = svc.plan_install(args.config, args.name, user=args.user, unit_dir=unit_dir, edgert=args.edgert,
                                env_file=args.env_file, metrics=args.metrics, watchdog_s=args.watchdog_sec)
        if args.dry_run:
            print(plan.unit_text, end="")
            return 0
        for line in svc.install(plan, start=not args.no_start):
            print(line)
        return 0
    if args.action == "uninstall":
        for line in svc.uninstall(args.name, unit_dir):
            print(line)
        return 0
    code, text = svc.status(args.name, unit_dir)
    print(text)
    return code
