#pragma once
// Deprecated forward (one release): use dtrain/fleet/optimizers.h.
#include "dtrain/fleet/optimizers.h"
#include "dtrain/torch/deprecated.h"
