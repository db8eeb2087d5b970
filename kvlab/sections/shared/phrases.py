"""Words that follow the numbers they speak of: a direction, a comparison, a count.

A sentence that states which way a figure moved, whether two figures are alike, or how many of a set did
something takes its words from here, from the values themselves rounded as the table beside them rounds them
(decimals, through present.cell), so that data going the other way changes the sentence and the words can never
say what the printed numbers deny. Figures that print the same are the same, whatever their last bits.
"""

from __future__ import annotations

from kvlab.sections.shared.ledger import round_half_up
from kvlab.sections.shared.present import cell

ALIKE_SHARE = 0.05  # two figures within 5% of the larger are called alike


def shown(value: float, decimals: int) -> float:
    """value as a table with decimals places prints it (present.cell's rounding), as a number."""
    return round_half_up(float(value), decimals)


def direction(before: float, after: float, decimals: int, words=("rise", "fall", "stay the same")) -> str:
    """words[0] if after prints above before, words[1] if below, words[2] if both print the same."""
    a, b = shown(before, decimals), shown(after, decimals)
    return words[0] if b > a else words[1] if b < a else words[2]


def change(before: float, after: float, decimals: int, words=("rise", "fall", "stay the same"), unit: str = "") -> str:
    """'rise from 4,265 to 26,461 (6.2x)', 'fall from 0.60 to 0.30 s (to 0.50x)' or 'stay the same at 0.60': the
    direction, the two figures as printed (then unit, if any) and, where both are positive, their ratio."""
    way = direction(before, after, decimals, words)
    unit = unit if unit.startswith("%") or not unit else f" {unit}"
    if way == words[2]:
        return f"{way} at {cell(before, decimals)}{unit}"
    a, b = shown(before, decimals), shown(after, decimals)
    ratio = "" if a <= 0 or b <= 0 else f" ({b / a:.1f}x)" if b > a else f" (to {b / a:.2f}x)"
    return f"{way} from {cell(before, decimals)} to {cell(after, decimals)}{unit}{ratio}"


def trend(values, labels, decimals: int, unit: str = "", words=("rise", "fall", "stay the same")) -> str:
    """The whole series in words, as printed: change() of its ends where it moves one way throughout ('rise from
    4,265 at 1 to 26,461 at 256 (6.2x)'); where one step makes most of its range, the rest as a band and that step
    ('stay between 3,726 and 4,266 from 1 to 128, then jump to 26,487 at 256'); else its ends and extremes with no
    steady trend. labels name the points (e.g. block sizes)."""
    shown_values = [shown(v, decimals) for v in values]
    steps = [b - a for a, b in zip(shown_values, shown_values[1:])]
    at = [f" at {label}" for label in labels]
    unit = unit if unit.startswith("%") or not unit else f" {unit}"
    first, last = shown_values[0], shown_values[-1]
    verb = (lambda v: v + "s") if words[0].endswith("s") else (lambda v: v)  # "latency rises", "preemptions rise"
    if all(d >= 0 for d in steps) or all(d <= 0 for d in steps):
        way = direction(first, last, decimals, words)
        if way == words[2]:
            return f"{way} at {cell(first, decimals)}{unit}"
        ratio = (
            ""
            if first <= 0 or last <= 0
            else f" ({last / first:.1f}x)"
            if last > first
            else f" (to {last / first:.2f}x)"
        )
        return f"{way} from {cell(first, decimals)}{at[0]} to {cell(last, decimals)}{unit}{at[-1]}{ratio}"
    span = max(shown_values) - min(shown_values)
    k = max(range(len(steps)), key=lambda i: abs(steps[i]))
    others = max((abs(d) for i, d in enumerate(steps) if i != k), default=0.0)
    if abs(steps[k]) > 0.5 * span and others <= 0.25 * abs(steps[k]):
        before, after = shown_values[: k + 1], shown_values[k + 1 :]
        band = (
            f"{verb('stay')} between {cell(min(before), decimals)} and {cell(max(before), decimals)}{unit} from {labels[0]} to "
            f"{labels[k]}"
            if k
            else f"{verb('start')} at {cell(before[0], decimals)}{unit}{at[0]}"
        )
        move = verb("jump" if steps[k] > 0 else "drop")
        end = (
            ""
            if k + 1 == len(shown_values) - 1
            else f" and end at {cell(shown_values[-1], decimals)}{at[-1]} (between {cell(min(after), decimals)} and "
            f"{cell(max(after), decimals)} after it)"
        )
        return f"{band}, then {move} to {cell(shown_values[k + 1], decimals)}{at[k + 1]}{end}"
    low, high = shown_values.index(min(shown_values)), shown_values.index(max(shown_values))
    return (
        f"{verb('move')} with no steady trend from {cell(shown_values[0], decimals)}{at[0]} to "
        f"{cell(shown_values[-1], decimals)}{unit}{at[-1]}, between {cell(shown_values[low], decimals)}{at[low]} and "
        f"{cell(shown_values[high], decimals)}{at[high]}"
    )


def alike(a: float, b: float, decimals: int, share: float) -> bool:
    """Whether a and b, as printed, differ by at most share of the larger (share 0.05: within 5%)."""
    a, b = shown(a, decimals), shown(b, decimals)
    return abs(a - b) <= share * max(abs(a), abs(b))


def comparison(
    name_a: str, a: float, name_b: str, b: float, decimals: int, unit: str, share: float = ALIKE_SHARE
) -> str:
    """'A and B are alike (a and b unit, within 5%)' or 'B takes 8.0x as long as A (b against a unit)': the words
    follow the two figures as printed, the figures the order of the names in the sentence."""
    pa, pb = shown(a, decimals), shown(b, decimals)
    both = f"{cell(a, decimals)} and {cell(b, decimals)} {unit}"
    if alike(a, b, decimals, share):
        return f"{name_a} and {name_b} are alike ({both}, within {100 * share:g}%)"
    if pa > 0 and pb > 0:
        (big, x), (small, y) = sorted([(name_a, a), (name_b, b)], key=lambda p: -shown(p[1], decimals))
        return f"{big} takes {max(pa, pb) / min(pa, pb):.1f}x as long as {small} ({cell(x, decimals)} against {cell(y, decimals)} {unit})"
    return f"{name_a} and {name_b} differ ({both})"


def shift(before: float, after: float, decimals: int) -> str:
    """The change from before to after in percent, signed ('+61%', '-13%', '0%'), of the figures as printed."""
    a, b = shown(before, decimals), shown(after, decimals)
    if a == 0:
        return "n/a"
    text = f"{100 * (b / a - 1):+.0f}%"
    return "0%" if text in ("+0%", "-0%") else text


def counted(counts: dict) -> str:
    """'2 meet every objective, 4 miss one and 4 miss two' from {'meet every objective': 2, 'miss one': 4,
    'miss two': 4}, in the dict's order, leaving out kinds counted 0; '' when every count is 0."""
    parts = [f"{n:,} {what}" for what, n in counts.items() if n]
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts)
