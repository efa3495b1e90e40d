#include "batchtune/training/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <dirent.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/stat.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>
#include <utility>

#include "batchtune/common/atomic_file.h"
#include "batchtune/common/error.h"
#include "batchtune/common/file_roles.h"
#include "batchtune/common/option.h"
#include "batchtune/memory/budget_allocator.h"
#include "batchtune/models/model.h"
#include "batchtune/training/train_summary_json.h"
#include "training/checkpoint_fields.h"
#include "training/checkpoint_json.h"

namespace batchtune {
namespace {

// Version 2: tensors checksummed, the run's identity recorded, the optimizer
// as one checksummed byte tensor. Version 1 (no "format" entry) is refused
// with a message that says so.
constexpr const char* kFormat = "batchtune-checkpoint/2";

/// Relative difference below which two learning rates are the same (they go
/// through JSON and the plan's scaling arithmetic).
constexpr double kLrTolerance = 1e-9;

/// The files a checkpoint write makes, whose temporaries a killed run leaves.
const std::array<const char*, 3> kCheckpointFiles = {kCheckpointFile, kModelStateFile,
                                                     kModelScriptFile};

uint32_t crc_of(const at::Tensor& tensor) {
  const at::Tensor t = tensor.contiguous();
  return crc32_of(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
}

at::Tensor bytes_tensor(const std::string& bytes) {
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

std::vector<std::string> names_of(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::vector<std::string> names;
  names.reserve(named.size());
  for (const auto& [name, tensor] : named) names.push_back(name);
  return names;
}

}  // namespace

void check_same_run(const RunIdentity& saved, const RunIdentity& expected,
                    const std::string& path) {
  const auto refuse = [&](const char* field, const std::string& was, const std::string& is,
                          const std::string& given_by) {
    throw OptionError(Option::kResume,
                      fmt::format("{} was written by a run with {} {}, this one has {}; resume "
                                  "with the same {}, or give another {} DIR to start afresh",
                                  path, field, was, is, given_by, mention(Option::kCheckpoint)));
  };
  if (saved.model != expected.model) {
    refuse("model", saved.model, expected.model, mention(Option::kModel));
  }
  if (saved.input != expected.input) {
    refuse("input", saved.input, expected.input, mention(Option::kInput));
  }
  if (saved.optimizer != expected.optimizer) {
    refuse("optimizer", saved.optimizer, expected.optimizer, mention(Option::kOptimizer));
  }
  if (saved.amp != expected.amp) refuse("amp", saved.amp, expected.amp, mention(Option::kAmp));
  if (saved.world_size != expected.world_size) {
    refuse("world size", std::to_string(saved.world_size), std::to_string(expected.world_size),
           "number of processes (launch " + mention(Option::kNproc) + ")");
  }
  if (saved.global_batch_size != expected.global_batch_size) {
    refuse("global batch", std::to_string(saved.global_batch_size),
           std::to_string(expected.global_batch_size),
           mention(Option::kTargetBatch) + " (or " + mention(Option::kPlan) + ")");
  }
  if (saved.train_size != expected.train_size) {
    refuse("training samples", std::to_string(saved.train_size),
           std::to_string(expected.train_size), mention(Option::kData));
  }
  if (saved.seed != expected.seed) {
    refuse("seed", std::to_string(saved.seed), std::to_string(expected.seed),
           mention(Option::kSeed));
  }
  if (std::abs(saved.lr - expected.lr) > kLrTolerance * std::max(saved.lr, expected.lr)) {
    refuse("lr", fmt::format("{:.6g}", saved.lr), fmt::format("{:.6g}", expected.lr),
           mention(Option::kLr) + " / " + mention(Option::kBaseLr));
  }
  if (saved.warmup_steps != expected.warmup_steps) {
    refuse("warm-up", std::to_string(saved.warmup_steps), std::to_string(expected.warmup_steps),
           mention(Option::kWarmup));
  }
}

int remove_stale_checkpoint_files(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  std::vector<std::string> stale;
  while (const dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    for (const char* file : kCheckpointFiles) {
      const std::string prefix = std::string(file) + ".tmp.";
      if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string pid_text = name.substr(prefix.size());
      if (pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9) {
        continue;  // not a temporary of ours
      }
      const auto pid = static_cast<pid_t>(std::stol(pid_text));
      // A writer that still runs (or that we may not signal) keeps its file.
      if (pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(name);
    }
  }
  ::closedir(d);
  for (const auto& name : stale) {
    if (::unlink((dir + "/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

void write_checkpoint(const std::string& dir, const CheckpointTarget& target,
                      const CheckpointRecord& record) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    throw OptionError(Option::kCheckpoint, dir,
                      fmt::format("cannot make the directory ({}); check that its parent exists "
                                  "and is writable",
                                  std::strerror(errno)));
  }
  remove_stale_checkpoint_files(dir);
  BudgetAllocator::UncountedScope uncounted;  // host copies, not device memory
  torch::serialize::OutputArchive archive;
  nlohmann::json crcs = nlohmann::json::object();
  const auto put = [&](const std::string& key, const at::Tensor& tensor, bool is_buffer) {
    const at::Tensor t = tensor.detach().cpu().contiguous();
    crcs[key] = crc_of(t);
    archive.write(key, t, is_buffer);
  };
  const auto params = target.model.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    put("model/param/" + std::to_string(i), params[i].second, false);
  }
  const auto buffers = target.model.named_buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    put("model/buffer/" + std::to_string(i), buffers[i].second, true);
  }
  {
    torch::serialize::OutputArchive optimizer;
    target.optimizer.save(optimizer);
    std::ostringstream bytes;
    optimizer.save_to(bytes);
    put("optimizer", bytes_tensor(bytes.str()), false);
  }
  put("scaler", at::tensor(target.scaler.state(), at::TensorOptions().dtype(at::kDouble)), false);
  put("generator", at::detail::getDefaultCPUGenerator().get_state(), false);

  const CheckpointPosition& p = record.position;
  nlohmann::json meta = {
      {"format", kFormat},
      {"identity", to_json(record.identity)},
      {"position",
       {{"step", p.step},
        {"epoch", p.epoch},
        {"batch_in_epoch", p.batch_in_epoch},
        {"samples", p.samples},
        {"oom_recoveries", p.oom_recoveries}}},
      {"plan", to_json(record.plan)},
      {"parameters", names_of(params)},
      {"buffers", names_of(buffers)},
      {"crc32", crcs},
      {"summary", record.summary ? to_json(*record.summary) : nlohmann::json()},
  };
  if (record.adapt) meta["adapt"] = *record.adapt;
  if (record.tokens) meta["tokens"] = *record.tokens;
  if (!record.loss_window.empty()) meta["loss_window"] = record.loss_window;
  if (const auto& kept = record.successive; kept && kept->previous.size > 0) {
    // The last step's gradient under noise/previous, the one before under
    // noise/earlier (absent in checkpoints of one kept step).
    const auto put_kept = [&](const std::string& name, const SuccessiveGradients::Kept& k) {
      nlohmann::json defined = nlohmann::json::array();
      for (size_t i = 0; i < k.gradient.size(); ++i) {
        defined.push_back(k.gradient[i].defined());
        if (k.gradient[i].defined()) {
          put("noise/" + name + "/" + std::to_string(i), k.gradient[i], false);
        }
      }
      put("noise/" + name + "_sq_norm", k.sq_norm, false);
      if (k.loss_scale.defined()) put("noise/" + name + "_scale", k.loss_scale, false);
      return nlohmann::json{
          {"size", k.size}, {"defined", defined}, {"scaled", k.loss_scale.defined()}};
    };
    nlohmann::json successive = put_kept("previous", kept->previous);
    if (kept->earlier.size > 0) {
      successive["earlier"] = put_kept("earlier", kept->earlier);
      put("noise/cross", kept->cross, false);
    }
    meta["successive"] = successive;
    meta["crc32"] = crcs;  // with the tensors just put
  }
  const std::string meta_text = meta.dump();
  archive.write("meta", c10::IValue(meta_text));
  archive.write("meta_crc32",
                c10::IValue(static_cast<int64_t>(crc32_of(meta_text.data(), meta_text.size()))));
  std::ostringstream bytes;
  archive.save_to(bytes);
  // The exports first, the checkpoint last: a checkpoint on disk implies
  // exports of its step (or, after a kill between them, of the next one,
  // which a resume rewrites).
  write_model_exports(dir, target.model);
  write_file_atomically(dir + "/" + kCheckpointFile, bytes.str());
}

namespace {

OptionError not_a_checkpoint(const std::string& path, const std::string& why) {
  return OptionError(Option::kResume,
                     fmt::format("{} is not a batchtune checkpoint ({}); delete it, or give "
                                 "another {} DIR to start afresh",
                                 path, why, mention(Option::kCheckpoint)));
}

OptionError corrupt_checkpoint(const std::string& path, const std::string& what) {
  return OptionError(Option::kResume, fmt::format("{} is corrupt ({}); restore a good copy, or "
                                                  "delete it to start afresh",
                                                  path, what));
}

/// Loads `path` into `archive` and returns its checked record (the JSON
/// "meta"); throws `batchtune::Error` naming the file.
nlohmann::json load_checked_meta(const std::string& path,
                                 torch::serialize::InputArchive& archive) {
  const auto not_ours = [&](const std::string& why) { return not_a_checkpoint(path, why); };
  nlohmann::json meta;
  check_input_file(path, Option::kResume);  // a FIFO would block the open
  try {
    archive.load_from(path, c10::Device(c10::kCPU));
  } catch (const std::exception& e) {
    throw not_ours(first_line(e.what()));
  }
  try {
    c10::IValue meta_value;
    archive.read("meta", meta_value);
    const std::string& text = meta_value.toStringRef();
    c10::IValue crc_value;
    if (!archive.try_read("meta_crc32", crc_value)) {
      throw not_ours("written by an older batchtune, without checksums");
    }
    if (static_cast<uint32_t>(crc_value.toInt()) != crc32_of(text.data(), text.size())) {
      throw corrupt_checkpoint(path, "its record does not match its checksum");
    }
    meta = nlohmann::json::parse(text);
    if (meta.value("format", "") != kFormat) {
      throw not_ours("format " + meta.value("format", std::string("unknown")) + ", not " +
                     kFormat);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw not_ours(first_line(e.what()));
  }
  return meta;
}

}  // namespace

namespace {

/// `read(meta, path)` over the checked metadata of `dir/checkpoint.pt`;
/// nullopt when there is none. What `read` cannot find makes the file "not
/// a checkpoint".
template <typename Read>
auto read_meta_field(const std::string& dir, Read read)
    -> std::optional<decltype(read(nlohmann::json(), std::string()))> {
  const std::string path = dir + "/" + kCheckpointFile;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  BudgetAllocator::UncountedScope uncounted;
  torch::serialize::InputArchive archive;
  const nlohmann::json meta = load_checked_meta(path, archive);
  try {
    return read(meta, path);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw not_a_checkpoint(path, first_line(e.what()));
  }
}

}  // namespace

std::optional<RunIdentity> read_checkpoint_identity(const std::string& dir) {
  return read_meta_field(dir, [](const nlohmann::json& meta, const std::string&) {
    return identity_from_json(meta.at("identity"));
  });
}

std::optional<Plan> read_checkpoint_plan(const std::string& dir) {
  return read_meta_field(dir, [](const nlohmann::json& meta, const std::string& path) {
    return plan_from_json(meta.at("plan"), "--resume " + path);
  });
}

std::optional<CheckpointRecord> read_checkpoint(const std::string& dir,
                                                const RunIdentity& expected,
                                                const CheckpointTarget& target) {
  const std::string path = dir + "/" + kCheckpointFile;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  remove_stale_checkpoint_files(dir);
  // What is read is host copies, not the device's; what the run keeps of it
  // (the optimizer's state) is made counted below.
  std::optional<BudgetAllocator::UncountedScope> uncounted(std::in_place);
  const auto not_ours = [&](const std::string& why) { return not_a_checkpoint(path, why); };
  const auto corrupt = [&](const std::string& what) { return corrupt_checkpoint(path, what); };
  torch::serialize::InputArchive archive;
  const nlohmann::json meta = load_checked_meta(path, archive);

  CheckpointRecord record;
  std::vector<std::string> param_names;
  std::vector<std::string> buffer_names;
  try {
    record.identity = identity_from_json(meta.at("identity"));
    const auto& p = meta.at("position");
    check_position_fields(p, path);
    if (meta.contains("adapt")) check_adapt_fields(meta.at("adapt"), path);
    if (const auto& summary = meta.at("summary"); summary.is_object() && summary.contains("batch_schedule")) {
      check_batch_schedule_fields(summary.at("batch_schedule"), "summary.batch_schedule",
                                  CheckpointFields(path));
    }
    record.position.step = p.at("step").get<int64_t>();
    record.position.epoch = p.at("epoch").get<int64_t>();
    record.position.batch_in_epoch = p.at("batch_in_epoch").get<int64_t>();
    record.position.samples = p.at("samples").get<int64_t>();
    record.position.oom_recoveries = p.at("oom_recoveries").get<int64_t>();
    record.plan = plan_from_json(meta.at("plan"), "--resume " + path);
    if (!meta.at("summary").is_null()) record.summary = summary_from_json(meta.at("summary"));
    if (meta.contains("adapt")) record.adapt = meta.at("adapt");
    if (meta.contains("tokens")) record.tokens = meta.at("tokens");
    if (meta.contains("loss_window")) {
      record.loss_window = meta.at("loss_window").get<std::vector<double>>();
    } else if (record.tokens && record.tokens->contains("loss_window")) {
      // Text checkpoints before the window was every run's keep it there.
      record.loss_window = record.tokens->at("loss_window").get<std::vector<double>>();
    }
    param_names = meta.at("parameters").get<std::vector<std::string>>();
    buffer_names = meta.at("buffers").get<std::vector<std::string>>();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw not_ours(first_line(e.what()));
  }
  check_same_run(record.identity, expected, path);

  const auto params = target.model.named_parameters();
  const auto buffers = target.model.named_buffers();
  if (names_of(params) != param_names || names_of(buffers) != buffer_names) {
    throw OptionError(Option::kResume,
                      fmt::format("{} holds other parameters than the model ({} and {} buffers "
                                  "there, {} and {} here); use the same {}",
                                  path, param_names.size(), buffer_names.size(), params.size(),
                                  buffers.size(), mention(Option::kModel)));
  }
  // Every tensor read and checked before anything of the target changes.
  const auto& crcs = meta.at("crc32");
  const auto get = [&](const std::string& key, bool is_buffer) {
    at::Tensor t;
    try {
      archive.read(key, t, is_buffer);
    } catch (const std::exception& e) {
      throw not_ours(key + " missing: " + first_line(e.what()));
    }
    if (!crcs.contains(key) || crcs.at(key).get<uint32_t>() != crc_of(t)) {
      throw corrupt(key + " does not match its checksum");
    }
    return t;
  };
  const auto check_shape = [&](const at::Tensor& saved, const at::Tensor& live,
                               const std::string& name) {
    if (saved.sizes() != live.sizes() || saved.scalar_type() != live.scalar_type()) {
      throw OptionError(Option::kResume,
                        fmt::format("{} holds {} as {} {}, the model has {} {}; use the same {} "
                                    "and {}",
                                    path, name, c10::toString(saved.scalar_type()),
                                    c10::str(saved.sizes()), c10::toString(live.scalar_type()),
                                    c10::str(live.sizes()), mention(Option::kModel),
                                    mention(Option::kInput)));
    }
  };
  std::vector<at::Tensor> saved_params;
  for (size_t i = 0; i < params.size(); ++i) {
    saved_params.push_back(get("model/param/" + std::to_string(i), false));
    check_shape(saved_params.back(), params[i].second, params[i].first);
  }
  std::vector<at::Tensor> saved_buffers;
  for (size_t i = 0; i < buffers.size(); ++i) {
    saved_buffers.push_back(get("model/buffer/" + std::to_string(i), true));
    check_shape(saved_buffers.back(), buffers[i].second, buffers[i].first);
  }
  if (meta.contains("successive")) {
    try {
      const auto& kept = meta.at("successive");
      const auto get_kept = [&](const std::string& name, const nlohmann::json& about) {
        SuccessiveGradients::Kept k;
        k.size = about.at("size").get<double>();
        const auto defined = about.at("defined").get<std::vector<bool>>();
        for (size_t i = 0; i < defined.size(); ++i) {
          k.gradient.push_back(defined[i] ? get("noise/" + name + "/" + std::to_string(i), false)
                                          : at::Tensor());
        }
        k.sq_norm = get("noise/" + name + "_sq_norm", false);
        if (about.at("scaled").get<bool>()) k.loss_scale = get("noise/" + name + "_scale", false);
        return k;
      };
      SuccessiveGradients::State state;
      state.previous = get_kept("previous", kept);
      if (kept.contains("earlier")) {
        state.earlier = get_kept("earlier", kept.at("earlier"));
        state.cross = get("noise/cross", false);
      }
      record.successive = std::move(state);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw not_ours("successive: " + first_line(e.what()));
    }
  }
  const at::Tensor optimizer_bytes = get("optimizer", false);
  const at::Tensor scaler = get("scaler", false).to(at::kDouble);
  const at::Tensor generator = get("generator", false);

  // The optimizer's state is the training's memory, as the whole run's was:
  // made on the parameters' device and counted there (uncounted, a resumed
  // run had the headroom of a run without it).
  uncounted.reset();
  const c10::Device device =
      params.empty() ? c10::Device(c10::kCPU) : params.front().second.device();
  try {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].second.copy_(saved_params[i]);
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].second.copy_(saved_buffers[i]);
    torch::serialize::InputArchive optimizer;
    optimizer.load_from(static_cast<const char*>(optimizer_bytes.data_ptr()),
                        static_cast<size_t>(optimizer_bytes.numel()), device);
    target.optimizer.load(optimizer);
    target.scaler.load_state(
        {scaler.data_ptr<double>(), scaler.data_ptr<double>() + scaler.numel()});
    at::Generator default_generator = at::detail::getDefaultCPUGenerator();
    default_generator.set_state(generator);
  } catch (const std::exception& e) {
    throw OptionError(Option::kResume,
                      fmt::format("{} does not load into this run ({}); give another {} DIR to "
                                  "start afresh",
                                  path, first_line(e.what()), mention(Option::kCheckpoint)));
  }
  return record;
}

}  // namespace batchtune
