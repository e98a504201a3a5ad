// meshsim — the command-line tool.
//   meshsim query [--file requests.jsonl]   JSON Lines in, one answer per line (DESIGN §7)
//   meshsim ops                             list the query ops
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>

#include "query.hpp"

int main(int argc, char** argv) {
  CLI::App app{"meshsim: device-mesh layout algebra and bookkeeping, testable on a laptop"};
  app.require_subcommand(1);

  auto* query = app.add_subcommand("query", "answer JSON-lines requests (stdin or --file)");
  std::string file;
  bool flush = false;
  query->add_option("-f,--file", file, "read requests from this file instead of stdin");
  query->add_flag("--flush", flush, "flush after every answer (for interactive pipes)");

  auto* ops = app.add_subcommand("ops", "list the ops `meshsim query` answers");

  CLI11_PARSE(app, argc, argv);

  std::ios::sync_with_stdio(false);
  if (*query) {
    if (file.empty()) {
      meshsim::query::run(std::cin, std::cout, flush);
    } else {
      std::ifstream in(file);
      if (!in) {
        std::cerr << "meshsim query: cannot open '" << file << "'\n";
        return 2;
      }
      meshsim::query::run(in, std::cout, flush);
    }
    return std::cout.good() ? 0 : 1;
  }
  if (*ops) {
    for (const auto& name : meshsim::query::ops()) std::cout << name << '\n';
  }
  return 0;
}
