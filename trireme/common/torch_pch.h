// Precompiled header for the libtorch-facing targets: the narrow libtorch headers most
// files need. Pure (trireme_core) files never see it.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
