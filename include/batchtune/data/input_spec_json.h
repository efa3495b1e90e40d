#pragma once

#include <string>

#include "batchtune/data/input_spec.h"

namespace batchtune {

/// Parses a spec written as JSON; `what` names the file in errors.
///
/// ```json
///   {"inputs": [{"name": "tokens", "shape": [128], "dtype": "int64", "vocab": 32000},
///               {"name": "mask", "shape": [128], "dtype": "float32"}],
///    "target": {"kind": "token", "classes": 32000},
///    "loss": "ce"}
/// ```
/// `target.kind` is `class`, `token`, `float` (with `shape`) or `none`;
/// `loss` defaults to `ce` for class and token targets, `mse` for float
/// targets, `model` for none. Every error names the file and the field.
InputSpec parse_input_spec_json(const std::string& text, const std::string& what);

/// Reads and parses a JSON spec file; throws `batchtune::Error` naming it.
InputSpec load_input_spec(const std::string& path);

}  // namespace batchtune
