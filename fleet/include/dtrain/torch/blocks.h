#pragma once
// Deprecated forward (one release): use dtrain/fleet/blocks.h.
#include "dtrain/fleet/blocks.h"
#include "dtrain/torch/deprecated.h"
