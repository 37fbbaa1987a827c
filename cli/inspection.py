"""`graphsync inspect`: what a rewrite would do to a saved graph, as text or JSON; writes nothing.

(Named inspection, not inspect, so that running a file of this directory as a script cannot
shadow the standard library's inspect module.)
"""
from __future__ import annotations

import dataclasses
import json

import click

from cli import shell


@click.command(epilog="""\b
Examples:
  graphsync inspect train.meta
  graphsync inspect train.meta -v           # every op of every layer in every tower
  graphsync inspect export_dir --tags train --json""")
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=True))
@shell.towers_option
@shell.device_option
@shell.strategy_option
@shell.group_size_option
@shell.tags_option
@click.option("--json", "as_json", is_flag=True, help="Print the inspection as JSON on stdout.")
@shell.verbose_option
def inspect(input_path, towers, device, strategy, group_size, tags, as_json, verbose):
    """Show the towers in INPUT and every batch-norm candidate: what a rewrite would synchronize,
    what it would leave alone and why, and whether gradients are already built. Writes nothing."""
    shell.precheck_paths(input_path)
    graphsync = shell.library(verbose)
    shell.check_device(device)
    with shell.library_errors(), shell.shown_warnings(False, verbose):
        options = graphsync.plan.options.RewriteOptions.of(towers=towers, device=device, strategy=strategy,
                                                           group_size=group_size)
        loaded = graphsync.io.load(input_path, tags)
        n_ops = len(loaded.graph.get_operations())
        plan, inlined = graphsync.rewrite.plan_with(loaded.graph, options, refuse=False)   # in the loaded copy only
    info = _inspection(loaded, plan, options, n_ops, inlined)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(_format_inspection(info, verbose))
    if plan.refused:   # every verdict is listed above; the status and the line are the rewrite's
        raise shell.Failure(plan.refused)


def _inspection(loaded, plan, options, n_ops: int, inlined: list) -> dict:
    """What `inspect` shows, as plain data."""
    from graphsync.plan.normalizations import normalizations  # noqa: PLC0415 (shell.library imported it)
    devices = _tower_devices(loaded.graph, plan)
    layers = []
    for name, members in normalizations(plan.layers):   # a batch norm by hand: one layer, its reductions under it
        first = members[0]
        reductions = [{"name": layer.name, "gradients": layer.has_gradients,
                       "grad_ops_per_tower": len(layer.sites[0].grad_ops), "sites": _sites(layer)}
                      for layer in members] if first.form.reduces else []
        layers.append({
            "name": name, "kind": first.shown_kind.value, "found_as": first.found_as, "synchronize": True,
            "gradients": any(layer.has_gradients for layer in members),
            "grad_ops_per_tower": sum(len(layer.sites[0].grad_ops) for layer in members),
            "sites": _sites(first), "reductions": reductions})
    skipped = []
    for op_name, reason in plan.skipped:
        tower = next((t.label for t in sorted(plan.towers, key=lambda t: -len(t.prefix))
                      if t.prefix and op_name.startswith(t.prefix)), None)
        skipped.append({"op": op_name, "tower": tower, "reason": reason})
    n_layers, n_towers = len(layers), len(plan.towers)
    with_grads = sum(layer["gradients"] for layer in layers)
    if not layers:
        if n_towers == 0:
            summary = "no towers found" if skipped else "no batch norm found"
        elif n_towers == 1:
            summary = f"1 tower ({plan.towers[0].label}): nothing to synchronize across"
        else:
            summary = f"0 layers × {n_towers} towers: nothing to synchronize"
    else:
        grads = ("gradients present" if with_grads == n_layers else "no gradients yet" if not with_grads
                 else f"gradients present for {with_grads} of {n_layers} layers")
        summary = f"{n_layers} layer{'s' * (n_layers != 1)} × {n_towers} towers, {grads}"
    if plan.refused:
        summary = "a rewrite refuses this graph, for the reason below"
    return {"input": loaded.path, "format": loaded.format, "tags": list(loaded.tags),
            "ops": n_ops, "inlined": inlined,
            "towers": [{"name": t.label, "prefix": t.prefix, "device": devices.get(t.label, "")}
                       for t in plan.towers],
            "towers_found_by": plan.found_by,
            "device": plan.device, "strategy": options.strategy.value,
            "groups": [[plan.towers[i].label for i in g] for g in plan.groups],
            "layers": layers, "skipped": skipped,
            "cross_example": [{"op": r.op, "type": r.type, "tower": r.tower, "verdict": r.verdict, "why": r.why}
                              for r in plan.cross_example],
            "trace_ended": [{"op": op, "why": why} for op, why in plan.trace_ended],
            "unfollowed": [dataclasses.asdict(u) for u in plan.unfollowed],
            "refused": plan.refused,
            "summary": summary}


def _sites(layer) -> list[dict]:
    return [{"tower": s.tower.label, "op": s.op.name, "device": s.device} for s in layer.sites]


def _tower_devices(graph, plan) -> dict:
    """Each tower's device: that of its batch-norm ops, else the most common among its ops."""
    devices = {}
    if plan.layers:
        for site in plan.layers[0].sites:
            devices[site.tower.label] = site.device
    for tower in plan.towers:
        if tower.label in devices:
            continue
        counts = {}
        for op in graph.get_operations():
            if op.device and op.name.startswith(tower.prefix):
                counts[op.device] = counts.get(op.device, 0) + 1
        devices[tower.label] = max(counts, key=counts.get) if counts else ""
    return devices


def _format_inspection(info: dict, verbose: bool) -> str:
    from graphsync.report import listed_reductions  # noqa: PLC0415 (shell.library imported it)
    lines = [f"{info['input']}: {info['format']}"
             + (f" (tags {','.join(info['tags'])})" if info["tags"] else "") + f", {info['ops']} ops"]
    towers = info["towers"]
    lines.append(f"towers ({len(towers)}):" + (f" found by {info['towers_found_by']}" if towers else " none"))
    for t in towers:
        lines.append(f"  {t['name']:<12} {t['device'] or '(no device)'}")
    if info["layers"]:
        if info["strategy"] == "allreduce":
            lines.append("statistics all-reduced on the towers' own devices (CollectiveReduceV2)")
        else:
            lines.append(f"statistics combined on {info['device'] or '(default device)'}")
        if len(info["groups"]) > 1:
            lines.append(f"sync groups ({len(info['groups'])}): "
                         + "; ".join(", ".join(group) for group in info["groups"]))
        width = max(len("layer"), max(len(layer["name"]) for layer in info["layers"]))
        kinds = max(4, max(len(layer["kind"]) for layer in info["layers"]))
        lines.append(f"batch-norm layers ({len(info['layers'])}), one op in each tower:")
        header = f"  {'layer':<{width}}  {'kind':<{kinds}}  would  gradient ops per tower"
        lines.append(header)
        for layer in info["layers"]:
            row = (f"  {layer['name']:<{width}}  {layer['kind']:<{kinds}}  sync   "
                   f"{layer['grad_ops_per_tower'] if layer['gradients'] else 'none yet'}")
            lines.append(f"{row:<{len(header)}}  {layer['found_as']}" if layer["reductions"] else row)
            shown = listed_reductions(layer["name"], [r["name"] for r in layer["reductions"]])
            if verbose and not shown:
                lines.extend(f"      {site['tower']:<10} {site['op']}  {site['device']}" for site in layer["sites"])
            for reduction in (r for r in layer["reductions"] if r["name"] in shown):
                lines.append(f"    {reduction['name']}")
                if verbose:
                    lines.extend(f"        {site['tower']:<10} {site['op']}  {site['device']}"
                                 for site in reduction["sites"])
    if info["inlined"]:
        lines.append(f"tf.function calls a rewrite inlines first ({len(info['inlined'])}):")
        lines.extend(f"  {name}" for name in (info["inlined"] if verbose else info["inlined"][:3]))
        if len(info["inlined"]) > 3 and not verbose:
            lines.append(f"  … {len(info['inlined']) - 3} more (-v lists them)")
    if info["skipped"]:
        lines.append(f"left alone ({len(info['skipped'])}):")
        for s in info["skipped"]:
            lines.append(f"  {s['op']}" + (f" [{s['tower']}]" if s["tower"] else "") + f": {s['reason']}")
    rows = info.get("cross_example", [])
    if rows:
        shown = rows if verbose else [r for r in rows if r["verdict"] != "synchronized"]
        lines.append(f"ops combining examples ({len(rows)}), in forward order, with their verdict:")
        for r in shown:
            lines.append(f"  {r['verdict']:<12} {r['op']} ({r['type']})" + (f" [{r['tower']}]" if r["tower"] else "")
                         + f": {r['why']}")
        if len(shown) < len(rows):
            lines.append(f"  … {len(rows) - len(shown)} synchronized (-v lists them, and why)")
    if info.get("unfollowed"):
        lines.append(f"not checked, past where the batch axis's trace ended ({len(info['unfollowed'])}):")
        lines.extend(f"  {u['op']} ({u['type']}): read back into the model; "
                     + (f"the trace ended here: {u['why']}" if u["op"] == u["end"] else f"past {u['end']}")
                     for u in info["unfollowed"])
    if verbose and info.get("trace_ended"):
        lines.append(f"where the batch axis's trace ended ({len(info['trace_ended'])}):")
        lines.extend(f"  {t['op']}: {t['why']}" for t in info["trace_ended"])
    lines.append(info["summary"])
    return "\n".join(lines)
