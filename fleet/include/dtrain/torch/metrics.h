#pragma once
// Deprecated forward (one release): use dtrain/fleet/metrics.h.
#include "dtrain/fleet/metrics.h"
#include "dtrain/torch/deprecated.h"
