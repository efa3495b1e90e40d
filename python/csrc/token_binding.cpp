#include "token_binding.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "batchtune/data/token_batches.h"

namespace py = pybind11;

namespace batchtune::python {
namespace {

/// Micro-batches as Python takes them: (indices, real tokens, padded tokens).
using PyTokenBatch = std::tuple<std::vector<int64_t>, int64_t, int64_t>;

std::vector<PyTokenBatch> to_python(const std::vector<TokenBatch>& batches) {
  std::vector<PyTokenBatch> out;
  out.reserve(batches.size());
  for (const TokenBatch& b : batches) out.emplace_back(b.indices, b.tokens, b.padded_tokens);
  return out;
}

std::vector<TokenBatch> from_python(const std::vector<PyTokenBatch>& batches) {
  std::vector<TokenBatch> out;
  out.reserve(batches.size());
  for (const auto& [indices, tokens, padded] : batches) out.push_back({indices, tokens, padded});
  return out;
}

}  // namespace

void bind_tokens(py::module_& m) {
  py::class_<LengthBucketSampler>(
      m, "LengthBucketSampler",
      "The token-budget micro-batches of train --data text:DIR: each epoch the samples "
      "shuffled (seeded by seed and the epoch), each in the bucket of the smallest bound at "
      "least its length, a micro-batch filled while its padded tokens stay within the budget.")
      .def(py::init([](std::vector<int64_t> lengths,
                       const std::vector<std::pair<int64_t, int64_t>>& buckets,
                       int64_t token_budget, uint64_t seed) {
             std::vector<LengthBucket> bs;
             for (const auto& [bound, micro] : buckets) bs.push_back({bound, micro});
             return LengthBucketSampler(std::move(lengths), std::move(bs), token_budget, seed);
           }),
           py::arg("lengths"), py::arg("buckets"), py::arg("token_budget"), py::arg("seed"))
      .def(
          "epoch",
          [](const LengthBucketSampler& s, int64_t epoch) { return to_python(s.epoch(epoch)); },
          py::arg("epoch"), "The epoch's micro-batches: [(indices, tokens, padded_tokens)].")
      .def(
          "batches",
          [](const LengthBucketSampler& s, const std::vector<int64_t>& order) {
            return to_python(s.batches(order));
          },
          py::arg("order"), "The micro-batches of the samples `order`, visited in that order.")
      .def_property_readonly("token_budget", &LengthBucketSampler::token_budget);
  m.def(
      "steps_by_tokens",
      [](const std::vector<PyTokenBatch>& batches, int64_t target_tokens, int64_t ranks) {
        return steps_by_tokens(from_python(batches), target_tokens, ranks);
      },
      py::arg("batches"), py::arg("target_tokens"), py::arg("ranks") = 1,
      "The rounds of micro-batches (one a rank) of each optimizer step: whole rounds until "
      "their real tokens over every rank reach target_tokens.");
  m.def("mean_length", &mean_length, py::arg("lengths"));
  m.def(
      "buckets_for_lengths",
      [](const std::vector<std::pair<int64_t, int64_t>>& buckets, int64_t token_budget,
         const std::vector<int64_t>& lengths) {
        std::vector<LengthBucket> bs;
        for (const auto& [bound, micro] : buckets) bs.push_back({bound, micro});
        std::vector<std::pair<int64_t, int64_t>> out;
        for (const LengthBucket& b : buckets_for_lengths(bs, token_budget, lengths)) {
          out.emplace_back(b.max_length, b.micro_batch_size);
        }
        return out;
      },
      py::arg("buckets"), py::arg("token_budget"), py::arg("lengths"),
      "The plan's buckets cut finer at the data's own length quantiles: [(max_length, "
      "micro_batch_size)].");
}

}  // namespace batchtune::python
