/*
 * param.c — the one parameter model (zstd's ZSTD_cParam_getBounds / ZSTD_CCtx_setParameter): a
 * subsystem keeps a table of its integer parameters (name, bounds, default) indexed by its public enum;
 * its setter checks a value here, its bounds query answers from the table, and Lua reads the bounds
 * through that query instead of writing them again. One message format for every refusal.
 */
#include "core.h"

WkStatus wk_param_bounds(const WkParamTable *table, int param, int64_t *min, int64_t *max) {
  if (param < 0 || param >= table->count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "unknown %s parameter %d", table->owner, param);
  *min = table->specs[param].min;
  *max = table->specs[param].max;
  return WK_OK;
}

WkStatus wk_param_check(const WkParamTable *table, int param, int64_t value, int64_t min, int64_t max) {
  if (value >= min && value <= max) return WK_OK;
  return WK_FAIL(WK_ERR_INVALID_ARG, "%s %s=%lld is outside [%lld, %lld]", table->owner, table->specs[param].name,
                 (long long)value, (long long)min, (long long)max);
}

WkStatus wk_param_default(const WkParamTable *table, int param, int64_t *value) {
  if (param < 0 || param >= table->count)
    return WK_FAIL(WK_ERR_INVALID_ARG, "unknown %s parameter %d", table->owner, param);
  *value = table->specs[param].fallback;
  return WK_OK;
}

void wk_param_defaults(const WkParamTable *table, int64_t *values) {
  for (int p = 0; p < table->count; p++) values[p] = table->specs[p].fallback;
}
