#include <ATen/ops/scaled_dot_product_attention.h>
#include <fmt/format.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <utility>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/models/activation_checkpoint.h"
#include "models/builtin_models.h"

namespace batchtune::models {
namespace {

namespace nn = torch::nn;

// GPT-2's choices (Radford et al. 2019): an MLP 4x the width, weights
// initialised from N(0, 0.02).
constexpr int64_t kMlpExpansion = 4;
constexpr double kInitStd = 0.02;

/// Causal multi-head self-attention through `scaled_dot_product_attention`,
/// which picks the fused (flash / memory-efficient) kernel where the device
/// has one, as a PyTorch user's model would.
struct CausalSelfAttentionImpl : nn::Module {
  CausalSelfAttentionImpl(int64_t width, int64_t heads)
      : heads(heads),
        qkv(register_module("qkv", nn::Linear(width, 3 * width))),
        proj(register_module("proj", nn::Linear(width, width))) {}

  at::Tensor forward(const at::Tensor& x) {
    const int64_t batch = x.size(0), time = x.size(1), width = x.size(2);
    // [B, T, 3W] -> 3 x [B, heads, T, W / heads]
    auto parts = qkv(x).view({batch, time, 3, heads, width / heads}).permute({2, 0, 3, 1, 4});
    at::Tensor y = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], {},
                                                    /*dropout_p=*/0.0, /*is_causal=*/true);
    return proj(y.transpose(1, 2).reshape({batch, time, width}));
  }

  int64_t heads;
  nn::Linear qkv;
  nn::Linear proj;
};
TORCH_MODULE(CausalSelfAttention);

/// x + attention(norm(x)), then x + mlp(norm(x)).
struct BlockImpl : nn::Module {
  BlockImpl(int64_t width, int64_t heads)
      : norm1(register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({width})))),
        attention(register_module("attention", CausalSelfAttention(width, heads))),
        norm2(register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({width})))),
        fc(register_module("fc", nn::Linear(width, kMlpExpansion * width))),
        proj(register_module("proj", nn::Linear(kMlpExpansion * width, width))) {}

  at::Tensor forward(at::Tensor x) {
    x = x + attention(norm1(x));
    return x + proj(nn::functional::gelu(fc(norm2(x))));
  }

  nn::LayerNorm norm1;
  CausalSelfAttention attention;
  nn::LayerNorm norm2;
  nn::Linear fc;
  nn::Linear proj;
};
TORCH_MODULE(Block);

struct GptImpl : nn::Module {
  GptImpl(int64_t vocab, int64_t max_length, const GptOptions& options, bool checkpointing)
      : token_embedding(register_module("token_embedding", nn::Embedding(vocab, options.width()))),
        position_embedding(
            register_module("position_embedding", nn::Embedding(max_length, options.width()))),
        norm(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({options.width()})))),
        checkpointing(checkpointing) {
    for (int64_t i = 0; i < options.layers(); ++i) {
      blocks->push_back(Block(options.width(), options.heads()));
    }
    register_module("blocks", blocks);
    if (!options.tied_head()) {
      head = register_module("head", nn::Linear(nn::LinearOptions(options.width(), vocab).bias(false)));
    }
    for (auto& p : named_parameters()) {
      if (p.key().find("norm") != std::string::npos) continue;  // LayerNorm keeps 1 and 0
      if (p.value().dim() >= 2) {
        nn::init::normal_(p.value(), 0.0, kInitStd);
      } else {
        nn::init::zeros_(p.value());
      }
    }
  }

  /// tokens [B, T] (int64, T at most the longest sequence) -> logits [B, T, vocab].
  at::Tensor forward(const at::Tensor& tokens) {
    const int64_t time = tokens.size(1);
    const at::Tensor positions = at::arange(time, tokens.options().dtype(at::kLong));
    at::Tensor x = token_embedding(tokens) + position_embedding(positions);
    for (const auto& module : *blocks) {
      auto* block = module->as<Block>();
      x = checkpointing && is_training()
              ? checkpointed([block](const at::Tensor& in) { return block->forward(in); }, x)
              : block->forward(x);
    }
    x = norm(x);
    return head.is_empty() ? at::matmul(x, token_embedding->weight.t()) : head(x);
  }

  nn::Embedding token_embedding;
  nn::Embedding position_embedding;
  nn::ModuleList blocks;
  nn::LayerNorm norm;
  nn::Linear head{nullptr};
  bool checkpointing;
};
TORCH_MODULE(Gpt);

}  // namespace

BuiltModule make_gpt(const ModelSpec& spec) {
  const GptOptions& options = spec.gpt;
  if (spec.input_shape.size() != 1) {
    throw OptionError(Option::kInput, fmt::format("gpt takes a sequence of token ids, like "
                                                  "int64:128; got {} dimensions per sample",
                                                  spec.input_shape.size()));
  }
  for (const auto& [option, value] : {std::pair{Option::kLayers, options.layers()},
                                      std::pair{Option::kHeads, options.heads()},
                                      std::pair{Option::kWidth, options.width()}}) {
    if (value < 1) throw OptionError(option, fmt::format("gpt needs at least 1, got {}", value));
  }
  if (options.width() % options.heads() != 0) {
    throw OptionError(Option::kWidth, fmt::format("gpt's width ({}) must be a multiple of {} ({})",
                                                  options.width(), mention(Option::kHeads),
                                                  options.heads()));
  }
  if (spec.classes != spec.vocab) {
    throw OptionError(Option::kClasses,
                      fmt::format("gpt predicts the next token, so its classes are its vocabulary "
                                  "({} {}); got {}",
                                  mention(Option::kVocab), spec.vocab, spec.classes));
  }
  // Per token and block: the q, k, v and output projections (4 w^2) and the
  // 4x MLP (8 w^2), as multiply-adds; attention scores and their weighted
  // sum, 2 T w over the causal half; then the head (w x vocab).
  const auto t = static_cast<double>(spec.input_shape.front());
  const auto w = static_cast<double>(options.width());
  const double flops = t * (static_cast<double>(options.layers()) * (2 * 12 * w * w + 2 * t * w) +
                            2 * w * static_cast<double>(spec.vocab));
  return built(Gpt(spec.vocab, spec.input_shape.front(), options, spec.checkpointing), flops);
}

}  // namespace batchtune::models
