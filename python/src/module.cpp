// meshsim._meshsim — the C++ library under `import meshsim` (pybind11). The Python package
// (python/meshsim/__init__.py) wraps it: errors become meshsim.errors classes by their C++
// class name, with the C++ message unchanged.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <variant>

#include "meshsim/stop.hpp"
#include "meshsim/check_meshes.hpp"
#include "meshsim/creation_plan.hpp"
#include "meshsim/group_names.hpp"
#include "meshsim/mesh_program.hpp"
#include "meshsim/cli_flags.hpp"
#include "meshsim/device_mesh.hpp"
#include "meshsim/error.hpp"
#include "meshsim/flight_recorder.hpp"
#include "meshsim/algebra.hpp"
#include "meshsim/layout.hpp"
#include "meshsim/mesh_json.hpp"
#include "meshsim/preset.hpp"
#include "meshsim/query.hpp"
#include "meshsim/recipe.hpp"
#include "meshsim/run.hpp"
#include "meshsim/step_job.hpp"
#include "module_parts.hpp"

namespace py = pybind11;
using meshsim::DeviceMesh;

namespace meshsim_py {

// int64_of: module_parts.hpp.
int64_t int64_of(const py::handle& o, const char* what) {
  if (!PyLong_Check(o.ptr()) || PyBool_Check(o.ptr())) {
    py::object cls = py::module_::import("meshsim.errors").attr("ArgumentTypeError");
    PyErr_SetString(cls.ptr(), (std::string(what) + " must be an int or a name, got " +
                                py::repr(o).cast<std::string>()).c_str());
    throw py::error_already_set();
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o.ptr(), &overflow);
  if (overflow != 0) {
    throw meshsim::OverflowError(std::string(what) + " " + py::str(o).cast<std::string>() +
                                 " does not fit in a 64-bit signed integer");
  }
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

}  // namespace meshsim_py

namespace {

using meshsim_py::int64_of;
using Names = std::optional<std::vector<std::string>>;

// nested turns a row-major array into nested Python lists.
py::list nested(const std::vector<int64_t>& shape, const std::vector<int64_t>& values) {
  std::size_t pos = 0;
  auto rec = [&](auto&& self, std::size_t dim) -> py::list {
    py::list out;
    for (int64_t i = 0; i < shape[dim]; ++i) {
      if (dim + 1 == shape.size()) {
        out.append(values[pos++]);
      } else {
        out.append(self(self, dim + 1));
      }
    }
    return out;
  };
  return shape.empty() ? py::list() : rec(rec, 0);
}

int dim_of(const DeviceMesh& m, const py::object& dim) {
  if (py::isinstance<py::str>(dim)) return m.dim_index(dim.cast<std::string>());
  const int64_t d = int64_of(dim, "dim");
  if (d < 0 || d >= m.ndim()) {
    throw meshsim::OutOfRange("dim " + std::to_string(d) + " is out of range [0, " + std::to_string(m.ndim()) + ")");
  }
  return static_cast<int>(d);
}

py::dict handle_dict(const meshsim::GroupHandle& h) {
  py::dict d;
  d["ranks"] = h.ranks;
  d["pg_ranks"] = h.pg_ranks;
  d["backend"] = h.backend.empty() ? py::none() : py::object(py::str(h.backend));
  d["timeout_ms"] = h.config.timeout.count();
  py::dict options;
  for (const auto& [k, v] : h.config.extras) std::visit([&](const auto& x) { options[py::str(k)] = x; }, v);
  d["options"] = options;
  d["group_desc"] = h.group_desc;
  d["name"] = h.name;
  return d;
}

// rows_as_lists builds groups(dim)'s list of lists straight from the flat table (one Python int
// per rank, no intermediate vectors).
py::list rows_as_lists(const meshsim::GroupTable& t) {
  PyObject* outer = PyList_New(static_cast<Py_ssize_t>(t.count));
  if (!outer) throw py::error_already_set();
  py::list out = py::reinterpret_steal<py::list>(outer);
  const int64_t* p = t.ranks.data();
  for (int64_t g = 0; g < t.count; ++g) {
    PyObject* row = PyList_New(static_cast<Py_ssize_t>(t.size));
    if (!row) throw py::error_already_set();
    PyList_SET_ITEM(outer, static_cast<Py_ssize_t>(g), row);  // owned by `out` from here on
    for (int64_t i = 0; i < t.size; ++i) {
      PyObject* v = PyLong_FromLongLong(*p++);
      if (!v) throw py::error_already_set();
      PyList_SET_ITEM(row, static_cast<Py_ssize_t>(i), v);
    }
  }
  return out;
}

// warn is warnings.warn(text) (a UserWarning) attributed `level` frames up; under
// warnings-as-errors it raises.
void warn(const std::string& text, int level) {
  if (PyErr_WarnEx(PyExc_UserWarning, text.c_str(), level) != 0) throw py::error_already_set();
}

// named_views builds a recipe: its views in recipe order, [(name, DeviceMesh)]; named_views_in
// names the recipe's file or preset in its errors, as the tool does.
std::vector<std::pair<std::string, DeviceMesh>> views_of(const meshsim::MeshRecipe& r, const meshsim::BuiltMeshes& b) {
  std::vector<std::pair<std::string, DeviceMesh>> out;
  for (const meshsim::View& v : meshsim::views(r)) out.emplace_back(v.name, v.step == 0 ? b.root : b.meshes[v.step - 1]);
  return out;
}
std::vector<std::pair<std::string, DeviceMesh>> named_views_in(const meshsim::MeshRecipe& r, const meshsim::RecipeFlags& f) {
  const meshsim::BuiltMeshes b = meshsim::apply_flags(r, f);
  for (const std::string& w : meshsim::shown_warnings(b.warnings)) warn(w, 3);
  return views_of(r, b);
}
std::vector<std::pair<std::string, DeviceMesh>> named_views(const meshsim::MeshRecipe& r) {
  const meshsim::BuiltMeshes b = meshsim::apply(r);
  for (const std::string& w : meshsim::shown_warnings(b.warnings)) warn(w, 3);
  return views_of(r, b);
}

// py_of_json is a JSON tree (the report) as Python values; strings are decoded as UTF-8 with
// any invalid byte replaced, as the tool's JSON output writes them.
py::object py_of_json(const nlohmann::json& j) {
  using T = nlohmann::json::value_t;
  switch (j.type()) {
    case T::null: return py::none();
    case T::boolean: return py::bool_(j.get<bool>());
    case T::number_integer: return py::int_(j.get<int64_t>());
    case T::number_unsigned: return py::int_(j.get<uint64_t>());
    case T::number_float: return py::float_(j.get<double>());
    case T::string: {
      const std::string& t = j.get_ref<const std::string&>();
      PyObject* u = PyUnicode_DecodeUTF8(t.data(), static_cast<Py_ssize_t>(t.size()), "replace");
      if (!u) throw py::error_already_set();
      return py::reinterpret_steal<py::object>(u);
    }
    case T::array: {
      py::list out;
      for (const nlohmann::json& e : j) out.append(py_of_json(e));
      return out;
    }
    case T::object: {
      py::dict out;
      for (const auto& [k, v] : j.items()) out[py::str(k)] = py_of_json(v);
      return out;
    }
    default: throw meshsim::Internal("the report holds a JSON value of no Python form");
  }
}

// run_job runs the job `o` asks for with the GIL released: (exit status, the report as Python
// values). The job runs on a thread of its own while this thread, Python's, looks at its signals
// every 100 ms: on Ctrl-C (or any handler that raises) the ranks are aborted, and once they have
// unwound the handler's exception (KeyboardInterrupt) is raised here, within about a second.
py::tuple run_job(meshsim::run::Options o) {
  auto stop = std::make_shared<std::atomic<bool>>(false);
  o.interrupted = [stop] { return stop->load(); };
  std::optional<meshsim::check::MeshCheckReport> report;
  std::exception_ptr failed;
  std::optional<py::error_already_set> raised;
  {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    py::gil_scoped_release release;
    // The job's ranks hold what they use: a rank left stuck is in the report, and the
    // interpreter stays.
    std::thread job([&] {
      try {
        report = meshsim::check::check_meshes(meshsim::run::job_of(o));
      } catch (...) {
        failed = std::current_exception();
      }
      std::lock_guard lk(mu);
      done = true;
      cv.notify_all();
    });
    std::unique_lock lk(mu);
    while (!cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return done; })) {
      if (raised) continue;
      lk.unlock();
      {
        py::gil_scoped_acquire acquire;
        if (PyErr_CheckSignals() != 0) {
          raised.emplace();  // holds the handler's exception until the ranks have unwound
          stop->store(true);
        }
      }
      lk.lock();
    }
    lk.unlock();
    job.join();
  }
  if (raised) throw std::move(*raised);
  if (failed) std::rethrow_exception(failed);
  return py::make_tuple(report->passed() ? 0 : 1, py_of_json(meshsim::check::report_json(*report)));
}

// run_released runs `work` (which touches no Python object) on a thread of its own with the
// GIL released, while this thread, Python's, looks at its signals every 100 ms: on Ctrl-C (or
// any handler that raises) the handler's exception (KeyboardInterrupt) is raised here at once.
// The work is then asked to stop (meshsim/stop.hpp: a step's simulation looks at the flag at its
// loops' heads and ends within milliseconds); until it has, it holds only what it owns, and its
// result is dropped.
// Works left running after an interrupt, awaited when the interpreter exits (atexit): none may
// still run while the process tears down what they use.
struct Orphans {
  std::mutex mu;
  std::condition_variable cv;
  int64_t running = 0;
};
Orphans& orphans() {
  static auto* o = new Orphans;  // never destroyed: the work threads may outlive static teardown
  return *o;
}

void await_orphans() {
  py::gil_scoped_release release;
  std::unique_lock lk(orphans().mu);
  orphans().cv.wait_for(lk, std::chrono::minutes(5), [] { return orphans().running == 0; });
}

nlohmann::json run_released(std::function<nlohmann::json()> work) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    nlohmann::json out;
    std::exception_ptr failed;
    std::atomic<bool> stop{false};  // set on Ctrl-C: the work stops at its next check_stop()
  };
  auto shared = std::make_shared<Shared>();
  std::optional<py::error_already_set> raised;
  {
    py::gil_scoped_release release;
    {
      std::lock_guard lk(orphans().mu);
      ++orphans().running;
    }
    std::thread([shared, work = std::move(work)] {
      nlohmann::json out;
      std::exception_ptr failed;
      try {
        const meshsim::StopScope scope(&shared->stop);
        out = work();
      } catch (...) {
        failed = std::current_exception();
      }
      {
        std::lock_guard lk(shared->mu);
        shared->out = std::move(out);
        shared->failed = failed;
        shared->done = true;
        shared->cv.notify_all();
      }
      std::lock_guard lk(orphans().mu);
      --orphans().running;
      orphans().cv.notify_all();
    }).detach();
    std::unique_lock lk(shared->mu);
    while (!shared->cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return shared->done; })) {
      lk.unlock();
      {
        py::gil_scoped_acquire acquire;
        if (PyErr_CheckSignals() != 0) raised.emplace();
      }
      if (raised) {
        shared->stop = true;
        break;
      }
      lk.lock();
    }
  }
  if (raised) throw std::move(*raised);
  if (shared->failed) std::rethrow_exception(shared->failed);
  return std::move(shared->out);
}

// names_of reads a name or a sequence of names, as mesh[...]'s key or transpose's order
// (ArgumentTypeError naming `what` otherwise: a mixed list, bytes, an empty one).
std::vector<std::string> names_of(const py::object& o, const char* what = "mesh[...]") {
  if (py::isinstance<py::str>(o)) return {o.cast<std::string>()};
  std::vector<std::string> out;
  const bool sequence = py::isinstance<py::sequence>(o);
  if (sequence) {
    for (const py::handle n : o.cast<py::sequence>()) {
      if (!py::isinstance<py::str>(n)) {
        out.clear();
        break;
      }
      out.push_back(n.cast<std::string>());
    }
  }
  if (!sequence || out.size() != py::len(o) || out.empty()) {
    py::object cls = py::module_::import("meshsim.errors").attr("ArgumentTypeError");
    PyErr_SetString(cls.ptr(), (std::string(what) + " takes a dim name or a non-empty sequence of names, got " +
                                py::repr(o).cast<std::string>()).c_str());
    throw py::error_already_set();
  }
  return out;
}

// ---- Python values as the recipe reader's tree (no JSON text on the way) ----

// kMaxValueDepth bounds the nesting of a value handed to the recipe reader (deeper is ParseError
// naming it): what Python's own encoder walked (its recursion limit, 1000 by default), so a value
// the reader judged before is judged the same now.
constexpr int kMaxValueDepth = 990;

// set_error raises `cls` with `message`, bytes that are not UTF-8 (a file name the user gave)
// kept as backslash escapes instead of failing the raise with a UnicodeDecodeError.
void set_error(const py::object& cls, const std::string& message) {
  PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "backslashreplace");
  if (text == nullptr) {
    PyErr_Clear();
    PyErr_SetString(cls.ptr(), "(an error whose message could not be decoded)");
    return;
  }
  PyErr_SetObject(cls.ptr(), text);
  Py_DECREF(text);
}

[[noreturn]] void type_error(const std::string& message) {
  set_error(py::module_::import("meshsim.errors").attr("ArgumentTypeError"), message);
  throw py::error_already_set();
}

// tree_of is a Python value (dicts, lists, tuples, str, int, float, bool, None) as the tree the
// recipe reader judges. What JSON cannot say is refused here with meshsim's errors: NaN and
// infinity (InvalidArgument), another type or a key that is not a str, int, float, bool or None
// (ArgumentTypeError), nesting past kMaxValueDepth (ParseError); `what` names the value.
// An int beyond int64 is OverflowError naming it exactly and its nearest key (`key`), as the
// reader words an integer that does not fit.
nlohmann::json tree_of(const py::handle& o, const std::string& what, int depth = 0, const std::string& key = "") {
  if (depth > kMaxValueDepth) {
    throw meshsim::ParseError(what + " nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
  if (o.is_none()) return nullptr;
  if (PyBool_Check(o.ptr())) return o.ptr() == Py_True;
  if (PyLong_Check(o.ptr())) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o.ptr(), &overflow);
    if (overflow == 0) return static_cast<int64_t>(v);
    throw meshsim::OverflowError((key.empty() ? what : "'" + key + "'") + ": " + py::str(o).cast<std::string>() +
                                 " does not fit in a 64-bit signed integer");
  }
  if (PyFloat_Check(o.ptr())) {
    const double d = PyFloat_AsDouble(o.ptr());
    if (!std::isfinite(d)) {
      throw meshsim::InvalidArgument(what + ": " + py::repr(o).cast<std::string>() +
                                     " has no JSON form (NaN and infinity have none)");
    }
    return d;
  }
  if (py::isinstance<py::str>(o)) return o.cast<std::string>();
  if (py::isinstance<py::list>(o) || py::isinstance<py::tuple>(o)) {
    nlohmann::json out = nlohmann::json::array();
    for (const py::handle e : o) out.push_back(tree_of(e, what, depth + 1, key));
    return out;
  }
  if (py::isinstance<py::dict>(o)) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [k, v] : o.cast<py::dict>()) {
      std::string name;
      if (py::isinstance<py::str>(k)) name = k.cast<std::string>();
      else if (PyBool_Check(k.ptr())) name = k.ptr() == Py_True ? "true" : "false";
      else if (k.is_none()) name = "null";
      else if (PyLong_Check(k.ptr()) || PyFloat_Check(k.ptr())) name = py::str(k).cast<std::string>();
      else type_error(what + ": keys must be str, int, float, bool or None, not " + std::string(Py_TYPE(k.ptr())->tp_name));
      out[name] = tree_of(v, what, depth + 1, name);
    }
    return out;
  }
  type_error(what + ": Object of type " + std::string(Py_TYPE(o.ptr())->tp_name) + " is not JSON serializable");
}

// meshsim's errors as meshsim.errors' classes.
void bind_errors() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const meshsim::Error& e) {
      py::object errors = py::module_::import("meshsim.errors");
      py::object cls = py::hasattr(errors, e.type_name()) ? errors.attr(e.type_name()) : errors.attr("Error");
      set_error(cls, e.what());
    }
  });
}

// DeviceMesh and its group tables, as PyTorch names them.
void bind_device_mesh(py::module_& m) {
  // GroupTable: every group of a dim in one int64 buffer of shape (count, size), readable without
  // copying through the buffer protocol (memoryview, numpy.asarray, torch.frombuffer).
  py::class_<meshsim::GroupTable>(m, "GroupTable", py::buffer_protocol())
      .def_buffer([](meshsim::GroupTable& t) {
        return py::buffer_info(t.ranks.data(), static_cast<py::ssize_t>(sizeof(int64_t)),
                               py::format_descriptor<int64_t>::format(), 2,
                               {static_cast<py::ssize_t>(t.count), static_cast<py::ssize_t>(t.size)},
                               {static_cast<py::ssize_t>(t.size * sizeof(int64_t)), static_cast<py::ssize_t>(sizeof(int64_t))},
                               /*readonly=*/true);
      })
      .def_readonly("count", &meshsim::GroupTable::count)
      .def_readonly("size", &meshsim::GroupTable::size)
      .def("__len__", [](const meshsim::GroupTable& t) { return t.count; })
      .def("__getitem__", [](const meshsim::GroupTable& t, int64_t g) {
        if (g < 0) g += t.count;
        if (g < 0 || g >= t.count) {
          throw meshsim::OutOfRange("group " + std::to_string(g) + " is out of range [0, " + std::to_string(t.count) + ")");
        }
        const auto row = t.row(g);
        return std::vector<int64_t>(row.begin(), row.end());
      })
      .def("tolist", [](const meshsim::GroupTable& t) { return rows_as_lists(t); })
      .def("__repr__", [](const meshsim::GroupTable& t) {
        return "GroupTable(count=" + std::to_string(t.count) + ", size=" + std::to_string(t.size) + ")";
      });

  py::class_<DeviceMesh>(m, "DeviceMesh")
      .def_static("init", [](std::vector<int64_t> shape, Names names, std::string device_type,
                             std::optional<int64_t> world_size) {
        meshsim::RootOptions o;
        o.device_type = std::move(device_type);
        o.world_size = world_size;
        return DeviceMesh::init(shape, std::move(names), o);
      }, py::arg("shape"), py::arg("mesh_dim_names") = py::none(), py::arg("device_type") = "cpu",
         py::arg("world_size") = py::none())
      .def_static("_from_ranks", [](std::vector<int64_t> shape, std::vector<int64_t> ranks, Names names) {
        return DeviceMesh::from_ranks(shape, ranks, std::move(names));
      }, py::arg("shape"), py::arg("ranks"), py::arg("mesh_dim_names") = py::none())
      .def_static("_from_group", [](std::vector<int64_t> ranks, Names names) {
        return DeviceMesh::from_group(ranks, std::move(names));
      }, py::arg("ranks"), py::arg("mesh_dim_names") = py::none())
      .def_static("from_logical", [](std::vector<int64_t> shape, Names names) {
        meshsim::RootOptions o;
        o.device_type = "meta";  // a logical mesh: no world, no process groups
        o.init_backend = false;
        return DeviceMesh::init(shape, std::move(names), o);
      }, py::arg("shape"), py::arg("mesh_dim_names") = py::none(),
         "meshsim's own, not PyTorch API (pytorch/pytorch#178550 proposed DeviceMesh.from_logical; it was "
         "not merged): a mesh of the given shape on device 'meta', with no process groups.")
      .def("__getitem__", [](const DeviceMesh& self, const py::object& key) {
        const std::vector<std::string> n = names_of(key);
        // As PyTorch does (warnings.warn, stacklevel=2: the caller's line; the package's
        // argument wrapper is one frame between): once every name is known, before the slice's
        // own checks (a slice refused for its order or an overlap has warned already).
        const std::vector<std::string> flats = self.flattened_from_root(n);
        bool known = self.names().has_value();
        for (std::size_t i = 0; known && i < n.size(); ++i) {
          known = std::find(self.names()->begin(), self.names()->end(), n[i]) != self.names()->end() ||
                  std::find(flats.begin(), flats.end(), n[i]) != flats.end();
        }
        if (known) {
          for (const std::string& name : flats) warn(meshsim::flattened_slice_warning(name), 2);
        }
        return self.slice(std::span<const std::string>(n));
      })
      .def("find_flattened", [](const DeviceMesh& self, const py::object& dims) -> py::object {
        const std::vector<std::string> n = names_of(dims);
        std::optional<DeviceMesh> found = self.find_flattened(std::span<const std::string>(n));
        return found ? py::cast(std::move(*found)) : py::none();
      }, py::arg("dims"),
         "The mesh flattened from these dims of this mesh, found by layout (never by size), or None. "
         "What to use instead of slicing a flattened dim from the root, which PyTorch deprecates.")
      // The Python package wraps these two as flatten/unflatten: backends arrive as recipe JSON.
      .def("creation_plan", [](const DeviceMesh& self, int64_t rank, bool bound_device, bool new_group_use_split_group,
                               bool use_torchcomms, std::optional<int64_t> world_size,
                               std::optional<std::string> torch_version, const py::object& process_groups) {
        // The calls PyTorch's DeviceMesh makes for every root, flatten and unflatten of this
        // mesh's root so far, in call order (creation_plan.hpp).
        const meshsim::CreationOptions o{bound_device, new_group_use_split_group, use_torchcomms};
        if (world_size && *world_size < 1) {
          throw meshsim::InvalidArgument("creation_plan: world_size " + std::to_string(*world_size) + " is not >= 1");
        }
        meshsim::CreationPlan plan = meshsim::creation_plan(self, o, world_size.value_or(0));
        // The PyTorch answered as: the root's, unless named here; the program's own calls beside the mesh's.
        if (torch_version) plan.torch_version = meshsim::parse_torch_version(*torch_version);
        if (!process_groups.is_none()) {
          meshsim::GroupProgram g = meshsim::process_groups_from_json(tree_of(process_groups, "process_groups"),
                                                                      plan.world, plan.torch_version);
          plan.program = std::move(g.calls);
          plan.mesh_at = g.mesh_at;
        }
        if (rank < 0 || rank >= plan.world) {
          throw meshsim::OutOfRange("creation_plan: rank " + std::to_string(rank) + " is out of range [0, " +
                                    std::to_string(plan.world) + ")");
        }
        int64_t left = meshsim::query::kDefaultMaxAnswerElements;
        return py_of_json(meshsim::creation_plan_json(plan, rank, [&left](int64_t keys, int64_t per_key, int64_t overhead) {
          const int64_t per = per_key > INT64_MAX - overhead ? INT64_MAX : per_key + overhead;
          if (keys > left / per) {
            throw meshsim::ResourceExhausted("creation_plan: the plan would list more than " +
                                             std::to_string(meshsim::query::kDefaultMaxAnswerElements) + " elements");
          }
          left -= keys * per;
        }));
      }, py::kw_only(), py::arg("rank") = 0, py::arg("bound_device") = false, py::arg("new_group_use_split_group") = false,
         py::arg("use_torchcomms") = false, py::arg("world_size") = py::none(), py::arg("torch_version") = py::none(),
         py::arg("process_groups") = py::none(),
         "The process-group calls PyTorch's DeviceMesh makes, in order, on `rank`, for every root, _flatten and\n"
         "_unflatten call on this mesh's root so far (a dict: rank, options, steps, calls; one call a dict\n"
         "{'call': 'new_group'|'split_group'|'default', 'dim', 'ranks' | 'split_ranks', ...}). bound_device:\n"
         "init_process_group(device_id=...) bound the default group; new_group_use_split_group and\n"
         "use_torchcomms: torch.distributed.config's. FailedPreconditionError where the default backend cannot split.\n"
         "Each call carries 'group_name' (the name that PyTorch release gives the group on `rank`, or None) and\n"
         "'result' ('ProcessGroup', or what a non-member gets: 'None' or 'NON_GROUP_MEMBER'); 'problems' lists the\n"
         "groups whose members name them differently and the names two groups share, on any rank.\n"
         "torch_version: '2.13' or '2.14' (default: the root's); process_groups: the program's own calls, as\n"
         "`process_groups` of a mesh.program request ({'new_group': {...}}, {'split_group': {...}}, 'mesh').")
      .def("_flatten_impl", [](const DeviceMesh& self, std::optional<std::string> name, const py::object& backend) {
        std::optional<meshsim::BackendConfig> config;
        if (!backend.is_none()) config = meshsim::backend_config_from_json(tree_of(backend, "backend_override"), "backend_override");
        return self.flatten(name, config);
      })
      .def("_unflatten_impl", [](const DeviceMesh& self, const py::object& dim, std::vector<int64_t> sizes,
                                 std::vector<std::string> names, const py::object& override_value) {
        const bool by_name = py::isinstance<py::str>(dim);
        std::vector<meshsim::BackendConfig> inner;
        if (!override_value.is_none()) {
          inner = meshsim::backend_override_from_json(tree_of(override_value, "backend_override"), meshsim::MeshNames(names),
                                                      static_cast<int>(sizes.size()));
        }
        return by_name ? self.unflatten(dim.cast<std::string>(), sizes, names, std::move(inner))
                       : self.unflatten(int64_of(dim, "dim"), sizes, names, std::move(inner));
      })
      .def("transpose", [](const DeviceMesh& self, const py::sequence& order) {
        if (py::len(order) > 0 && py::isinstance<py::str>(order[0])) {
          const std::vector<std::string> n = names_of(order, "transpose");
          return self.transpose(std::span<const std::string>(n));
        }
        std::vector<int> idx;
        for (const py::handle d : order) {
          const int64_t v = int64_of(d, "transpose dim");
          if (v < 0 || v >= self.ndim()) {
            throw meshsim::OutOfRange("transpose: dim " + std::to_string(v) + " is out of range [0, " +
                                      std::to_string(self.ndim()) + ")");
          }
          idx.push_back(static_cast<int>(v));
        }
        return self.transpose(std::span<const int>(idx));
      })
      .def("reshape", [](const DeviceMesh& self, std::vector<int64_t> sizes, std::vector<std::string> names) {
        return self.reshape(sizes, names);
      })
      .def_property_readonly("shape", [](const DeviceMesh& self) { return py::tuple(py::cast(self.shape())); })
      .def_property_readonly("ndim", &DeviceMesh::ndim)
      .def("size", [](const DeviceMesh& self, const py::object& dim) {
        return dim.is_none() ? self.size() : self.size(dim_of(self, dim));
      }, py::arg("mesh_dim") = py::none())
      .def_property_readonly("mesh_dim_names", [](const DeviceMesh& self) -> py::object {
        if (!self.names()) return py::none();
        return py::tuple(py::cast(*self.names()));
      })
      .def_property_readonly("device_type", &DeviceMesh::device_type)
      .def("mesh_for", [](const DeviceMesh& self, int64_t rank) -> py::object {
        auto a = self.mesh_for(rank);
        if (!a) return py::none();
        return nested(a->shape, a->values);
      }, py::arg("rank"))
      // mesh is PyTorch's `mesh` property: the nested global ranks. A mesh with several copies
      // (a slice) has one per rank: mesh_for(rank) says which.
      .def_property_readonly("mesh", [](const DeviceMesh& self) -> py::object {
        if (self.copies() != 1) {
          throw meshsim::FailedPrecondition("this mesh is one of " + std::to_string(self.copies()) +
                                            " copies over the rank map, each rank sees its own: use mesh_for(rank)");
        }
        const auto a = self.mesh_for(self.rank_map().front());
        return nested(a->shape, a->values);
      })
      .def_property_readonly("layout", [](const DeviceMesh& self) { return meshsim::to_string(self.layout()); })
      .def_property_readonly("canonical_layout",
                             [](const DeviceMesh& self) { return meshsim::to_string(self.canonical_layout()); })
      .def_property_readonly("rank_map", &DeviceMesh::rank_map)
      .def_property_readonly("copies", &DeviceMesh::copies)
      .def("get_coordinate", [](const DeviceMesh& self, int64_t rank) -> py::object {
        auto c = self.coordinate(rank);
        if (!c) return py::none();
        return py::tuple(py::cast(*c));
      }, py::arg("rank"))
      .def("get_local_rank", [](const DeviceMesh& self, const py::object& dim, int64_t rank) -> py::object {
        if (dim.is_none() && self.ndim() > 1) {
          throw meshsim::FailedPrecondition("Found the DeviceMesh have " + std::to_string(self.ndim()) +
                                            " dimensions. Optional kwarg `mesh_dim` needs to be specified when "
                                            "device_mesh.ndim > 1.");
        }
        auto r = self.local_rank(rank, dim.is_none() ? 0 : dim_of(self, dim));
        if (!r) return py::none();
        return py::int_(*r);
      }, py::arg("mesh_dim") = py::none(), py::arg("rank") = 0)
      .def("groups", [](const DeviceMesh& self, const py::object& dim) { return rows_as_lists(self.group_table(dim_of(self, dim))); },
           py::arg("mesh_dim"))
      .def("group_table", [](const DeviceMesh& self, const py::object& dim) {
        const int d = dim_of(self, dim);
        py::gil_scoped_release release;
        return self.group_table(d);
      }, py::arg("mesh_dim"))
      .def("group_of", [](const DeviceMesh& self, int64_t rank, const py::object& dim) {
        return self.group_of(rank, dim_of(self, dim));
      }, py::arg("rank"), py::arg("mesh_dim"))
      .def("get_group", [](const DeviceMesh& self, const py::object& dim, int64_t rank) {
        if (dim.is_none()) return handle_dict(self.get_group(rank));
        if (py::isinstance<py::str>(dim)) return handle_dict(self.get_group(rank, std::string_view(dim.cast<std::string>())));
        return handle_dict(self.get_group(rank, dim_of(self, dim)));
      }, py::arg("mesh_dim") = py::none(), py::arg("rank") = 0)
      .def("get_all_groups", [](const DeviceMesh& self, int64_t rank) {
        py::list out;
        for (const auto& h : self.get_all_groups(rank)) out.append(handle_dict(h));
        return out;
      }, py::arg("rank") = 0)
      .def("get_root_mesh", &DeviceMesh::root)
      .def_property_readonly("is_root", &DeviceMesh::is_root)
      .def("cache_stats", [](const DeviceMesh& self) {
        const meshsim::CacheStats c = self.cache_stats();
        py::dict d;
        d["hits"] = c.hits;
        d["misses"] = c.misses;
        d["size"] = c.size;
        return d;
      })
      .def("__eq__", [](const DeviceMesh& a, const py::object& b) -> py::object {
        if (!py::isinstance<DeviceMesh>(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
        return py::bool_(a == b.cast<const DeviceMesh&>());
      })
      .def("__hash__", [](const DeviceMesh& self) { return static_cast<py::ssize_t>(self.hash()); })
      .def("__repr__", &DeviceMesh::to_string);

  m.def("concatenate", [](const std::vector<DeviceMesh>& meshes) { return DeviceMesh::concatenate(meshes); });
  m.def("equivalent", [](const DeviceMesh& a, const DeviceMesh& b) { return equivalent(a, b); });
  m.def("save", [](const DeviceMesh& mesh) { return meshsim::save_mesh(mesh); });
  m.def("load", [](const std::string& text) { return meshsim::load_mesh(text); });
}

// `meshsim query` in this process.
void bind_query(py::module_& m) {
  // query answers one `meshsim query` request line (meshsim.query: the protocol itself).
  m.def("query", [](const std::string& line) { return meshsim::query::answer_line(line); });
}

// The layout algebra.
// Recipes and presets built into views.
void bind_recipes(py::module_& m) {
  // recipe_views builds a recipe (a mesh.program request as Python values: a dict; `what` names
  // it in errors) and returns its views in recipe order: [(name, DeviceMesh)].
  m.def("recipe_views", [](const py::object& program, const std::string& what) {
    const nlohmann::json tree = tree_of(program, what);
    if (!tree.is_object()) throw meshsim::ParseError(what + " must be a dict (a mesh.program request)");
    return named_views(meshsim::recipe_from_json(tree));
  });
  // recipe_file_views reads a recipe file as `meshsim run --recipe` does (one reader: its size
  // and nesting limits, its typed errors naming the file) and builds its views.
  m.def("recipe_file_views", [](const std::string& path) {
    meshsim::RecipeFlags f;
    f.recipe_file = path;
    const meshsim::MeshRecipe r = meshsim::recipe_from_flags(f);
    return named_views_in(r, f);
  });
  m.def("preset_views", [](const std::string& spec, std::optional<int64_t> world_size) {
    return named_views(meshsim::preset::recipe(spec, world_size));
  }, py::arg("spec"), py::arg("world_size") = py::none());
}

// `meshsim run`: the engines, the typed call and the flags-list form.
void bind_run(py::module_& m) {
  // engines: the one name table `--backend` reads (every registered backend, then local).
  m.def("engines", [] {
    py::list out;
    for (const meshsim::check::EngineEntry& e : meshsim::check::engines()) {
      py::dict d;
      d["name"] = e.name;
      d["description"] = e.description;
      d["lockstep"] = e.lockstep;
      d["spans_processes"] = e.spans_processes;
      d["max_ranks"] = e.max_ranks;
      out.append(d);
    }
    return out;
  });
  // run is `meshsim run --format json` in this process: (exit status, the report as Python values).
  // The GIL is released while the ranks run.
  m.def("run", [](const std::string& mesh, const std::string& recipe_file, const std::string& preset,
                  std::optional<int64_t> world_size, const std::string& backend, std::vector<std::string> faults,
                  double timeout, std::optional<int64_t> max_elements) {
    meshsim::run::Options o;
    o.recipe.mesh = mesh;
    o.recipe.recipe_file = recipe_file;
    o.recipe.preset = preset;
    o.recipe.world_size = world_size;
    o.backend = backend;
    o.faults = std::move(faults);
    o.timeout_seconds = timeout;
    if (max_elements) o.max_elements = *max_elements;
    o.format = "json";
    return run_job(o);
  });
  // run_flags is `meshsim run FLAGS... --format json`: the flags as the tool reads them (the one
  // use of the tool's flag reader, meshsim_flags).
  m.def("run_flags", [](const std::vector<std::string>& flags) {
    for (const std::string& f : flags) {
      if (f == "--format" || f.rfind("--format=", 0) == 0) {
        throw meshsim::InvalidArgument("meshsim.run returns the JSON report: drop the flag '" + f + "'");
      }
    }
    meshsim::run::Options o = meshsim::cli::parse_run_flags(flags);
    o.format = "json";
    return run_job(o);
  });
}

// `meshsim step`.
void bind_step(py::module_& m) {
  // step is `meshsim step --preset ... --format json` in this process: the report as Python
  // values (with the Perfetto trace of the traced ranks under "trace" when asked).
  m.def("step", [](const py::kwargs& kw) {
    // Keywords bound to the typed spec through the one table of its fields (step_fields():
    // seq_len, microbatches, faults, ...); `trace` asks for the Perfetto trace as well.
    meshsim::step::StepSpec spec;
    bool trace = false;
    for (const auto& [key, value] : kw) {
      const std::string name = py::cast<std::string>(key);
      if (name == "trace") {
        trace = py::cast<bool>(value);
        continue;
      }
      const meshsim::step::StepField* f = meshsim::step::find_step_field(name);
      if (!f || name.rfind("--", 0) == 0) {
        std::string known = "trace";
        for (const auto& g : meshsim::step::step_fields()) known += ", " + std::string(g.keyword);
        throw meshsim::InvalidArgument("step: unknown keyword " + meshsim::quote_input(name) + " (" + known + ")");
      }
      if (value.is_none()) continue;  // the field's default
      std::visit(
          [&](auto member) {
            auto& field = spec.*member;
            using T = std::remove_reference_t<decltype(field)>;
            if constexpr (std::is_same_v<T, std::optional<int64_t>> || std::is_same_v<T, int64_t>) {
              field = int64_of(value, name.c_str());
            } else {
              try {
                field = py::cast<T>(value);
              } catch (const py::cast_error&) {
                type_error("step: " + name + " has the wrong type: " + py::repr(value).cast<std::string>().substr(0, 200));
              }
            }
          },
          f->member);
    }
    return py_of_json(run_released([spec = std::move(spec), trace] {
      const meshsim::step::StepRun run = meshsim::step::run_step(spec);
      nlohmann::json j = meshsim::step::step_json(run);
      if (trace) j["trace"] = meshsim::step::trace_json(run, meshsim::step::traced_ranks(run));
      return j;
    }));
  });
}

// `meshsim trace check`.
void bind_trace(py::module_& m) {
  // trace_check is `meshsim trace check DIR --format json` in this process.
  // all_to_all_totals false for a recording's dumps (meshsim record's: the fake backend moved no data).
  m.def("trace_check", [](const std::string& dir, std::optional<std::string> prefix, unsigned jobs, bool all_to_all_totals) {
    return py_of_json(run_released([dir, prefix, jobs, all_to_all_totals] {
      const meshsim::trace::DumpSet set = meshsim::trace::read_dump_dir(dir, prefix, {}, jobs);
      return meshsim::trace::report_json(
          meshsim::trace::check_dumps(set.dumps, meshsim::trace::CheckOptions{.all_to_all_totals = all_to_all_totals}), set);
    }));
  }, py::arg("dir"), py::arg("prefix"), py::arg("jobs"), py::arg("all_to_all_totals") = true);
}

}  // namespace

PYBIND11_MODULE(_meshsim, m) {
  // A step or trace check left running by Ctrl-C ends before the interpreter does.
  py::module_::import("atexit").attr("register")(py::cpp_function(&await_orphans));
  m.doc() = "meshsim: PyTorch's DeviceMesh bookkeeping and its CuTe layout algebra, exactly, in C++";
  bind_errors();
  bind_device_mesh(m);
  bind_query(m);
  meshsim_py::bind_layout(m);
  bind_recipes(m);
  bind_run(m);
  bind_step(m);
  bind_trace(m);
  // How many works left behind by Ctrl-C still run (each stops at its next check).
  m.def("_works_running", [] {
    std::lock_guard lk(orphans().mu);
    return orphans().running;
  });
}
