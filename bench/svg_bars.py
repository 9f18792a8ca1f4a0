"""The frame of the plain-SVG bar charts in bench/ (no plotting library in the engine's
environment): the page, its title, the y axis's grid lines and the slanted labels under the
bars. bench.prep_scaling_plot and bench.prep_handoff_plot draw their bars inside it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    width: int
    height: int
    left: int       # the y axis
    top: int        # the plot's top edge
    bottom: int     # room for the labels under the plot

    @property
    def plot_h(self) -> float:
        return self.height - self.top - self.bottom

    @property
    def plot_w(self) -> float:
        return self.width - self.left - 20

    def y(self, value: float, top_value: float) -> float:
        return self.top + self.plot_h * (1 - value / top_value)

    def start(self, title: str, top_value: float, tick: str = ".0f") -> list[str]:
        """The page, its title and five grid lines from 0 to top_value, labelled with `tick`."""
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
               f'font-family="sans-serif" font-size="11"><rect width="{self.width}" height="{self.height}" '
               f'fill="white"/>',
               f'<text x="{self.width / 2}" y="18" text-anchor="middle" font-size="13">{title}</text>']
        for i in range(5):
            v = top_value * i / 4
            yy = self.y(v, top_value)
            out.append(f'<line x1="{self.left}" x2="{self.width - 20}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#ddd"/>'
                       f'<text x="{self.left - 4}" y="{yy + 4:.1f}" text-anchor="end">{v:{tick}}</text>')
        return out

    def label(self, cx: float, text: str) -> str:
        """A label under the plot, slanted, ending at cx."""
        y = self.height - self.bottom + 14
        return f'<text x="{cx:.1f}" y="{y}" text-anchor="end" transform="rotate(-35 {cx:.1f} {y})">{text}</text>'
