#include "meshsim/svg.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "meshsim/error.hpp"

namespace meshsim::svg {

namespace {

constexpr int kCellW = 44, kCellH = 26, kMargin = 16, kHeaderLine = 16, kPanelGap = 28;
constexpr int64_t kPanelsPerRow = 4;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        out += (static_cast<unsigned char>(c) < 0x20) ? '?' : c;
    }
  }
  return out;
}

// Grid is how the mesh's dims map onto the picture: a panel dim and a row dim (-1: none), and
// the columns: every dim from col_first on, flattened row-major (the last fastest).
struct Grid {
  int panel_dim = -1, row_dim = -1, col_first = 0;
  int64_t panels = 1, rows = 1, cols = 1;        // drawn (capped)
  int64_t all_panels = 1, all_rows = 1, all_cols = 1;
};

Grid grid_of(const DeviceMesh& m) {
  Grid g;
  const int nd = m.ndim();
  if (nd == 2) {
    g.row_dim = 0;
    g.col_first = 1;
  } else if (nd >= 3) {
    g.panel_dim = 0;
    g.row_dim = 1;
    g.col_first = 2;
  }
  if (g.panel_dim >= 0) g.all_panels = m.size(g.panel_dim);
  if (g.row_dim >= 0) g.all_rows = m.size(g.row_dim);
  for (int d = g.col_first; d < nd; ++d) g.all_cols *= m.size(d);
  g.panels = std::min(g.all_panels, kMaxPanels);
  g.rows = std::min(g.all_rows, kMaxRows);
  g.cols = std::min(g.all_cols, kMaxCols);
  return g;
}

// fill is the colour of a group: hues a golden angle apart, so neighbouring groups differ.
std::string fill(int64_t group) {
  const double hue = std::fmod(static_cast<double>(group % 100000) * 137.508, 360.0);
  std::ostringstream s;
  s << "hsl(" << static_cast<int>(hue) << ",70%," << (group % 2 ? 72 : 82) << "%)";
  return s.str();
}

}  // namespace

std::string draw(const DeviceMesh& m, const Options& o) {
  const int nd = m.ndim();
  int color = nd - 1;
  if (o.color_dim) {
    color = -1;
    for (int d = 0; d < nd; ++d) {
      if (m.dim_name(d) == *o.color_dim) color = d;
    }
  }
  if (color < 0) {
    throw InvalidArgument("--color-dim " + quote_input(o.color_dim.value_or("")) + " is not a dim of " + m.to_string());
  }
  if (!m.contains(o.rank) && m.copies() != 1) {
    throw InvalidArgument("--svg: rank " + std::to_string(o.rank) + " is in no copy of " + m.to_string() +
                          "; give --rank with a rank of the copy to draw");
  }
  const Grid g = grid_of(m);
  const std::vector<int64_t> shape = m.shape();
  auto dim_label = [&](int d) { return escape(m.dim_name(d)); };
  // coords: a drawn cell's coordinate in every dim (the columns are the trailing dims flattened).
  auto coords = [&](int64_t p, int64_t r, int64_t c) {
    std::vector<int64_t> x(static_cast<std::size_t>(nd), 0);
    if (g.panel_dim >= 0) x[static_cast<std::size_t>(g.panel_dim)] = p;
    if (g.row_dim >= 0) x[static_cast<std::size_t>(g.row_dim)] = r;
    for (int d = nd - 1; d >= g.col_first; --d) {
      x[static_cast<std::size_t>(d)] = c % shape[static_cast<std::size_t>(d)];
      c /= shape[static_cast<std::size_t>(d)];
    }
    return x;
  };
  // The group of a cell along the colour dim: its coordinate without that dim, in mixed radix.
  auto group_of = [&](const std::vector<int64_t>& x) {
    int64_t index = 0;
    for (int d = 0; d < nd; ++d) {
      if (d != color) index = index * shape[static_cast<std::size_t>(d)] + x[static_cast<std::size_t>(d)];
    }
    return index;
  };
  std::string col_names;
  for (int d = g.col_first; d < nd; ++d) col_names += (col_names.empty() ? "" : ",") + dim_label(d);
  std::size_t row_label_chars = col_names.size();
  if (g.row_dim >= 0) row_label_chars = std::max(row_label_chars, m.dim_name(g.row_dim).size() + 4);
  const int64_t label_w = 12 + 7 * static_cast<int64_t>(std::min<std::size_t>(row_label_chars, 40));

  std::vector<std::string> caption{escape(m.to_string()),
                                   "colour: the groups of " + dim_label(color) + " (size " +
                                       std::to_string(m.size(color)) + "); labels: global ranks" +
                                       (m.copies() > 1 ? " (the copy holding rank " + std::to_string(o.rank) + ")" : "")};
  if (nd - g.col_first > 1) caption.push_back("columns: " + col_names + " flattened (the last fastest)");
  if (o.hosts) {
    caption.push_back("thick lines: host boundaries (" + std::to_string(o.hosts->gpus_per_host) + " GPUs per host)");
  }
  std::string cut;
  if (g.panels < g.all_panels) cut += "panels: first " + std::to_string(g.panels) + " of " + std::to_string(g.all_panels);
  if (g.rows < g.all_rows) cut += (cut.empty() ? "" : "; ") + std::string("rows: first ") + std::to_string(g.rows) + " of " + std::to_string(g.all_rows);
  if (g.cols < g.all_cols) cut += (cut.empty() ? "" : "; ") + std::string("columns: first ") + std::to_string(g.cols) + " of " + std::to_string(g.all_cols);
  if (!cut.empty()) caption.push_back("drawn: " + cut + " (" + std::to_string(m.size()) + " ranks in all)");

  const int64_t panel_rows = (g.panels + kPanelsPerRow - 1) / kPanelsPerRow;
  const int64_t panels_across = std::min(g.panels, kPanelsPerRow);
  const int64_t panel_w = label_w + g.cols * kCellW, panel_h = kHeaderLine * 2 + g.rows * kCellH;
  const int64_t header = kMargin + static_cast<int64_t>(caption.size()) * kHeaderLine;
  const int64_t width = 2 * kMargin + panels_across * panel_w + (panels_across - 1) * kPanelGap;
  const int64_t height = header + panel_rows * panel_h + (panel_rows - 1) * kPanelGap + kMargin;
  std::ostringstream out;
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (std::size_t i = 0; i < caption.size(); ++i) {
    out << "<text x=\"" << kMargin << "\" y=\"" << kMargin + static_cast<int64_t>(i + 1) * kHeaderLine - 4 << "\">"
        << caption[i] << "</text>\n";
  }
  for (int64_t p = 0; p < g.panels; ++p) {
    const int64_t px = kMargin + (p % kPanelsPerRow) * (panel_w + kPanelGap) + label_w;
    const int64_t py = header + (p / kPanelsPerRow) * (panel_h + kPanelGap) + kHeaderLine * 2;
    if (g.panel_dim >= 0) {
      out << "<text x=\"" << px - label_w << "\" y=\"" << py - kHeaderLine - 2 << "\" font-weight=\"bold\">"
          << dim_label(g.panel_dim) << "=" << p << "</text>\n";
    }
    out << "<text x=\"" << px - 6 << "\" y=\"" << py - 4 << "\" text-anchor=\"end\" fill=\"#555\">" << col_names
        << "</text>\n";
    for (int64_t c = 0; c < g.cols; ++c) {
      std::string label;
      const std::vector<int64_t> x = coords(p, 0, c);
      for (int d = g.col_first; d < nd; ++d) label += (label.empty() ? "" : ",") + std::to_string(x[static_cast<std::size_t>(d)]);
      out << "<text x=\"" << px + c * kCellW + kCellW / 2 << "\" y=\"" << py - 4
          << "\" text-anchor=\"middle\" font-size=\"9\" fill=\"#555\">" << label << "</text>\n";
    }
    std::vector<std::vector<int64_t>> ranks;
    for (int64_t r = 0; r < g.rows; ++r) {
      if (g.row_dim >= 0) {
        out << "<text x=\"" << px - 6 << "\" y=\"" << py + r * kCellH + kCellH / 2 + 4 << "\" text-anchor=\"end\" fill=\"#555\">"
            << dim_label(g.row_dim) << "=" << r << "</text>\n";
      }
      // The trailing dims are contiguous in row-major order: one call per row.
      int64_t first = r * g.all_cols;
      if (g.panel_dim >= 0) first += p * g.all_rows * g.all_cols;
      const std::optional<std::vector<int64_t>> row = m.mesh_values(o.rank, first, g.cols);
      if (!row || row->size() != static_cast<std::size_t>(g.cols)) {
        throw Internal("svg: the mesh row at position " + std::to_string(first) + " came back short");
      }
      ranks.push_back(*row);
      for (int64_t c = 0; c < g.cols; ++c) {
        const int64_t x = px + c * kCellW, y = py + r * kCellH;
        const int64_t rank = (*row)[static_cast<std::size_t>(c)];
        const int64_t group = group_of(coords(p, r, c));
        out << "<rect class=\"cell\" data-rank=\"" << rank << "\" data-group=\"" << group << "\" x=\"" << x << "\" y=\""
            << y << "\" width=\"" << kCellW << "\" height=\"" << kCellH << "\" fill=\"" << fill(group)
            << "\" stroke=\"#888\" stroke-width=\"0.5\"/>\n"
            << "<text x=\"" << x + kCellW / 2 << "\" y=\"" << y + kCellH / 2 + 4 << "\" text-anchor=\"middle\">" << rank
            << "</text>\n";
      }
    }
    if (!o.hosts) continue;
    const int64_t G = o.hosts->gpus_per_host;
    for (int64_t r = 0; r < g.rows; ++r) {
      for (int64_t c = 0; c < g.cols; ++c) {
        const int64_t host = ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)] / G;
        const int64_t x = px + c * kCellW, y = py + r * kCellH;
        if (c + 1 < g.cols && ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(c) + 1] / G != host) {
          out << "<line class=\"host-boundary\" x1=\"" << x + kCellW << "\" y1=\"" << y << "\" x2=\"" << x + kCellW
              << "\" y2=\"" << y + kCellH << "\" stroke=\"black\" stroke-width=\"3\"/>\n";
        }
        if (r + 1 < g.rows && ranks[static_cast<std::size_t>(r) + 1][static_cast<std::size_t>(c)] / G != host) {
          out << "<line class=\"host-boundary\" x1=\"" << x << "\" y1=\"" << y + kCellH << "\" x2=\"" << x + kCellW
              << "\" y2=\"" << y + kCellH << "\" stroke=\"black\" stroke-width=\"3\"/>\n";
        }
      }
    }
  }
  out << "</svg>\n";
  return out.str();
}

}  // namespace meshsim::svg
