#pragma once
// Deprecated forward (one release): use dtrain/fleet/sync_batch_norm.h.
#include "dtrain/fleet/sync_batch_norm.h"
#include "dtrain/torch/deprecated.h"
