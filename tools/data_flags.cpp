#include "data_flags.h"

#include <fmt/format.h>

#include "batchtune/common/error.h"
#include "batchtune/data/fashion_mnist.h"
#include "batchtune/data/input_spec.h"
#include "batchtune/common/shape.h"

namespace batchtune::cli {

// Synthetic samples without --input / --classes: the workload defaults.
constexpr int64_t kDefaultDataClasses = 10;

void add_data_flags(CLI::App& app, DataFlags& flags) {
  app.add_option("--data", flags.data,
                 "synthetic, fashion-mnist[:DIR], imagefolder:DIR (one sub-folder per class, "
                 "JPEG/PNG, made to --input's CxHxW) or text:DIR (text files, a paragraph a "
                 "sample of byte tokens, for gpt)")
      ->capture_default_str();
  app.add_flag("--skip-bad-samples", flags.skip_bad_samples,
               "skip unreadable image files with a warning (counted) instead of stopping");
}

void check_text_inputs(const DataFlags& flags, const WorkloadFlags& workload) {
  for (const std::string& input : workload.inputs) {
    if (input.rfind("int64:", 0) != 0) {
      throw Error(fmt::format("--input: --data {} is byte tokens, so the input is a token length "
                              "or range like int64:16..512; got {}",
                              flags.data, input));
    }
  }
}

FileRole data_file_role(const DataFlags& flags) {
  const size_t colon = flags.data.find(':');
  const std::string name = flags.data.substr(0, colon);
  std::string dir;
  if (colon != std::string::npos) {
    dir = flags.data.substr(colon + 1);
  } else if (name == "fashion-mnist") {
    dir = kFashionMnistDefaultDir;
  }
  return {"--data", dir, FileAccess::kReadFolder};
}

DataSplits open_data(const DataFlags& flags, WorkloadFlags& workload) {
  if (!workload.input_spec.empty() || workload.inputs.size() > 1 ||
      (!workload.inputs.empty() && workload.inputs.front().find(':') != std::string::npos)) {
    if (flags.data == "synthetic") return {};
    throw Error(fmt::format("--data {}: reads one float input per sample; leave out "
                            "--input-spec and token inputs",
                            flags.data));
  }
  const std::vector<int64_t> requested = input_spec_from_flags(workload).inputs.front().shape;
  DataSplits data = open_dataset(
      flags.data, requested, workload.classes > 0 ? workload.classes : kDefaultDataClasses,
      workload.seed, DataOptions().skip_bad_samples(flags.skip_bad_samples));
  if (!data.train->synthetic()) {
    const std::string shape = format_shape(data.train->sample_shape());
    if (!workload.inputs.empty() && requested != data.train->sample_shape()) {
      throw Error(fmt::format("--input: {} has {} samples, not {}; leave --input out",
                              flags.data, shape, workload.inputs.front()));
    }
    workload.inputs = {shape};
    workload.classes = data.train->classes();
  }
  return data;
}

}  // namespace batchtune::cli
