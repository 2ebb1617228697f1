"""The RSS-over-time plot of scripts/soak.py, written as SVG by hand (no plotting library)."""

import math
from xml.sax.saxutils import escape

W, H = 760, 380
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 50


def nice_step(span, target=6):
    """A round tick step (1, 2 or 5 times a power of ten) giving about `target` ticks."""
    raw = span / target if span > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def rss_plot(samples, warmup_s, baseline_mib, tolerance, title):
    """`samples`: (seconds, rss MiB) pairs. Shades the warm-up, draws the allowed band
    (baseline +/- tolerance) after it, and the RSS line."""
    t_max = max((t for t, _ in samples), default=1.0) or 1.0
    values = [v for _, v in samples]
    lo = min(values + [baseline_mib * (1 - tolerance)] if baseline_mib else values)
    hi = max(values + [baseline_mib * (1 + tolerance)] if baseline_mib else values)
    y_step = nice_step(hi - lo, 5)
    y_lo = (lo // y_step) * y_step
    y_hi = (hi // y_step + 1) * y_step
    x_step = nice_step(t_max, 8)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(t):
        return LEFT + pw * t / t_max

    def y(v):
        return TOP + ph * (1 - (v - y_lo) / (y_hi - y_lo))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>',
    ]
    if warmup_s > 0:
        out.append(
            f'<rect x="{LEFT}" y="{TOP}" width="{x(min(warmup_s, t_max)) - LEFT:.1f}" '
            f'height="{ph}" fill="#eeeeee"/>'
        )
        out.append(f'<text x="{LEFT + 4}" y="{TOP + 14}" fill="#666">warm-up</text>')
    if baseline_mib:
        x0 = x(min(warmup_s, t_max))
        top, bot = y(baseline_mib * (1 + tolerance)), y(baseline_mib * (1 - tolerance))
        out.append(
            f'<rect x="{x0:.1f}" y="{top:.1f}" width="{LEFT + pw - x0:.1f}" '
            f'height="{bot - top:.1f}" fill="#dff0d8"/>'
        )
        out.append(
            f'<text x="{LEFT + pw - 4}" y="{top - 4:.1f}" text-anchor="end" fill="#3c763d">'
            f"allowed: baseline {baseline_mib:.0f} MiB +/- {tolerance * 100:.0f} %</text>"
        )
    v = y_lo
    while v <= y_hi + 1e-9:
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += y_step
    t = 0.0
    while t <= t_max + 1e-9:
        out.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP + ph}" y2="{TOP + ph + 5}" stroke="#333"/>')
        out.append(f'<text x="{x(t):.1f}" y="{TOP + ph + 18}" text-anchor="middle">{t:g}</text>')
        t += x_step
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 10}" text-anchor="middle">seconds since the server was healthy</text>')
    out.append(
        f'<text x="16" y="{TOP + ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {TOP + ph / 2})">RSS (MiB)</text>'
    )
    if samples:
        pts = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in samples)
        out.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
