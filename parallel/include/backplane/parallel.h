// backplane's LibTorch frontend: process groups, model-parallel state, mappings and tensor-parallel
// layers (namespace backplane::parallel, library libbackplane-parallel). It is an embedder of the C ABI:
// it calls only backplane.h, so it runs on every backend.
#pragma once

#include "backplane/parallel/activation_checkpoint.h"
#include "backplane/parallel/checkpoint.h"
#include "backplane/parallel/distributed.h"
#include "backplane/parallel/elastic.h"
#include "backplane/parallel/error.h"
#include "backplane/parallel/grads.h"
#include "backplane/parallel/layers.h"
#include "backplane/parallel/lora.h"
#include "backplane/parallel/mappings.h"
#include "backplane/parallel/parallel_state.h"
#include "backplane/parallel/parameters.h"
#include "backplane/parallel/pipeline.h"
#include "backplane/parallel/process_group.h"
#include "backplane/parallel/trainer.h"
#include "backplane/parallel/utils.h"
