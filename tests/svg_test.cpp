// The mesh picture: every drawn cell is a rank of the mesh, colours follow the groups of the
// chosen dim (checked against DeviceMesh::group_of, not the drawing's own bookkeeping), host
// boundaries are exactly the neighbouring cells on different hosts, names are escaped, big
// meshes are capped; and the file `meshsim show --svg` writes is valid XML (xmllint) and renders
// (rsvg-convert to PNG).
#include "meshsim/svg.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sys/wait.h>

#include "meshsim/error.hpp"

namespace meshsim {
namespace {

struct Cell {
  int64_t rank, group, x, y;
  std::string fill;
};

std::vector<Cell> cells(const std::string& svg) {
  static const std::regex re(
      R"re(<rect class="cell" data-rank="(\d+)" data-group="(\d+)" x="(\d+)" y="(\d+)" width="\d+" height="\d+" fill="([^"]+)")re");
  std::vector<Cell> out;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it) {
    out.push_back({std::stoll((*it)[1]), std::stoll((*it)[2]), std::stoll((*it)[3]), std::stoll((*it)[4]), (*it)[5]});
  }
  return out;
}

int64_t count_of(const std::string& text, const std::string& needle) {
  int64_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

DeviceMesh mesh(const std::vector<int64_t>& shape, const std::vector<std::string>& names) {
  return DeviceMesh::init(shape, MeshNames(names), {});
}

void expect_groups_are_colours(const DeviceMesh& m, const std::vector<Cell>& cs, int dim) {
  for (const Cell& a : cs) {
    for (const Cell& b : cs) {
      const auto ga = m.group_of(a.rank, dim);
      const bool same = std::find(ga->begin(), ga->end(), b.rank) != ga->end();
      EXPECT_EQ(a.group == b.group, same) << a.rank << " " << b.rank;
      if (same) EXPECT_EQ(a.fill, b.fill) << a.rank << " " << b.rank;
    }
  }
}

TEST(Svg, EveryRankIsOneCellAndColoursAreTheGroupsOfTheChosenDim) {
  for (const auto& [shape, names] : std::vector<std::pair<std::vector<int64_t>, std::vector<std::string>>>{
           {{6}, {"tp"}}, {{2, 4}, {"dp", "tp"}}, {{2, 3, 4}, {"dp", "cp", "tp"}}, {{2, 2, 2, 3}, {"pp", "dp", "cp", "tp"}},
           {{2, 2, 2, 2, 2}, {"pp", "dp_replicate", "dp_shard", "cp", "tp"}}}) {
    const DeviceMesh m = mesh(shape, names);
    for (int color = 0; color < m.ndim(); ++color) {
      const std::string svg = svg::draw(m, {.color_dim = names[static_cast<std::size_t>(color)]});
      const std::vector<Cell> cs = cells(svg);
      ASSERT_EQ(static_cast<int64_t>(cs.size()), m.size()) << m.to_string();
      std::set<int64_t> seen;
      for (const Cell& c : cs) seen.insert(c.rank);
      EXPECT_EQ(static_cast<int64_t>(seen.size()), m.size());
      EXPECT_EQ(*seen.rbegin(), m.size() - 1);
      expect_groups_are_colours(m, cs, color);
    }
    // The default colour dim is the last.
    EXPECT_EQ(svg::draw(m, {}), svg::draw(m, {.color_dim = names.back()}));
  }
}

TEST(Svg, HostBoundariesAreExactlyTheNeighboursOnDifferentHosts) {
  for (int64_t G : {1, 2, 3, 4, 8}) {
    const DeviceMesh m = mesh({2, 4, 6}, {"dp", "cp", "tp"});
    const std::string svg = svg::draw(m, {.hosts = placement::Hosts{.gpus_per_host = G, .nvlink_domain = G}});
    const std::vector<Cell> cs = cells(svg);
    std::map<std::pair<int64_t, int64_t>, int64_t> at;
    for (const Cell& c : cs) at[{c.x, c.y}] = c.rank;
    int64_t want = 0;
    for (const Cell& c : cs) {
      for (auto [dx, dy] : {std::pair<int64_t, int64_t>{44, 0}, {0, 26}}) {
        auto n = at.find({c.x + dx, c.y + dy});
        if (n != at.end() && n->second / G != c.rank / G) ++want;
      }
    }
    EXPECT_EQ(count_of(svg, "class=\"host-boundary\""), want) << "G=" << G;
  }
  EXPECT_EQ(count_of(svg::draw(mesh({4, 4}, {"dp", "tp"}), {}), "host-boundary"), 0);
}

TEST(Svg, NamesAreEscapedBigMeshesCappedAndBadDimsRefused) {
  const DeviceMesh odd = mesh({2, 2}, {"a<b&c", "\"q'"});
  const std::string svg = svg::draw(odd, {});
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_NE(svg.find("a&lt;b&amp;c"), std::string::npos);
  const DeviceMesh big = mesh({100, 100}, {"dp", "tp"});
  const std::string capped = svg::draw(big, {});
  EXPECT_EQ(static_cast<int64_t>(cells(capped).size()), svg::kMaxRows * svg::kMaxCols);
  EXPECT_NE(capped.find("rows: first 64 of 100; columns: first 64 of 100"), std::string::npos);
  const DeviceMesh huge = mesh({1 << 20, 1 << 20}, {"dp", "tp"});  // 2^40 ranks, drawn in part
  EXPECT_EQ(static_cast<int64_t>(cells(svg::draw(huge, {})).size()), svg::kMaxRows * svg::kMaxCols);
  EXPECT_THROW(svg::draw(big, {.color_dim = "cp"}), InvalidArgument);
}

#ifdef MESHSIM_EXE
int shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Svg, ShowWritesAFileXmllintAcceptsAndRsvgRenders) {
  if (shell("command -v xmllint >/dev/null && command -v rsvg-convert >/dev/null") != 0) {
    GTEST_SKIP() << "xmllint (libxml2-utils) or rsvg-convert (librsvg2-bin) is not installed; "
                    "scripts/install-deps.sh installs both";
  }
  const std::string dir = ::testing::TempDir();
  const std::string exe = MESHSIM_EXE;
  const std::vector<std::string> cases{
      "--mesh dp=2,tp=4", "--mesh dp=2,cp=2,tp=4 --gpus-per-host 4 --color-dim cp",
      "--preset torchtitan:pp=2,dp_replicate=2,dp_shard=4,cp=2,tp=2,ep=4 --gpus-per-host 8",
      "--preset megatron:tp=4,pp=2,cp=2,ep=2,etp=2 --world-size 64 --gpus-per-host 8 --color-dim dp",
      "--mesh dp=128,tp=128"};
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string svg = dir + "meshsim_pic" + std::to_string(i) + ".svg", png = svg + ".png";
    ASSERT_EQ(shell(exe + " show " + cases[i] + " --svg " + svg + " >/dev/null"), 0) << cases[i];
    EXPECT_EQ(shell("xmllint --noout " + svg), 0) << cases[i];
    ASSERT_EQ(shell("rsvg-convert -o " + png + " " + svg), 0) << cases[i];
    std::ifstream in(png, std::ios::binary);
    char magic[8] = {};
    in.read(magic, 8);
    EXPECT_EQ(std::string(magic + 1, 3), "PNG") << cases[i];
  }
  EXPECT_EQ(shell(exe + " show --mesh dp=2,tp=2 --svg " + dir + "x.svg --color-dim ep 2>/dev/null >/dev/null"), 2);
  EXPECT_EQ(shell(exe + " show --mesh dp=2,tp=2 --color-dim tp 2>/dev/null >/dev/null"), 2);
  EXPECT_EQ(shell(exe + " show --mesh dp=2,tp=2 --svg /nonexistent/dir/x.svg 2>/dev/null >/dev/null"), 2);
}
#endif

}  // namespace
}  // namespace meshsim
