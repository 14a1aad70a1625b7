"""The chart of a memory-policy replay (``bench.memory_replay``): per scenario, the memory's size and the
rolling rescue rate against items, one line per policy, the topic changes marked."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots


def memory_figure(out: dict) -> go.Figure:
    names = list(out["scenarios"])
    fig = make_subplots(rows=2, cols=len(names), shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[f"{what}, starting {'empty' if n == 'empty' else 'from the shipped memory'}"
                                        for what in ("patterns kept", "rescues per 100 tokens (last 10 items)")
                                        for n in names])
    colors = qualitative.Plotly + qualitative.Dark24
    for col, name in enumerate(names, 1):
        sc = out["scenarios"][name]
        for k, p in enumerate(sc["policies"]):
            for row, key in ((1, "size"), (2, "rescues_per_100_rolling")):
                ys = p["series"][key]
                fig.add_trace(go.Scatter(x=list(range(1, len(ys) + 1)), y=ys, name=p["name"], legendgroup=p["name"],
                                         showlegend=col == 1 and row == 1, mode="lines",
                                         line={"color": colors[k % len(colors)], "width": 1.6}), row=row, col=col)
        for s, topic in zip(sc["starts"], sc["topics"]):
            for row in (1, 2):
                fig.add_vline(x=s + 0.5, line={"dash": "dot", "color": "#888"}, row=row, col=col)
            fig.add_annotation(x=s + 1, y=1, yref="y domain", text=topic, showarrow=False, xanchor="left",
                               row=1, col=col)
        fig.update_xaxes(title_text="items of the stream", row=2, col=col)
    fig.update_layout(title=f"The correction memory on a stream that changes topic (teacher-forced replay, "
                            f"gamma {out['gamma']}, lambda {out['lam']:g}, tau {out['tau']:g})",
                      height=760, template="plotly_white", legend={"font": {"size": 11}})
    return fig
