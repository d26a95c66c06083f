/* hyla_profile.h — where a forward pass spends its time, for diagnostics (HYLA_PROFILE=1).
 *
 * When on, the runtime syncs the device at named marks inside the forward pass (hyla_session.c)
 * and charges the time since the previous mark to the mark's label, separately for prefill
 * pieces and decode steps. The syncs cost time of their own (and break CUDA graphs into small
 * segments), so the shares, not the sum, are what to read; hyla-bench e2e prints them after each
 * measurement. Off (the default), a mark is one load of a global flag. The tables are per
 * thread: meant for one model driven by one thread (hyla-bench, hyla-run); of a tensor-parallel
 * group, the caller's thread (rank 0) reads its own. */
#ifndef HYLA_PROFILE_H
#define HYLA_PROFILE_H

#include <stdio.h>

#include "hyla_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

extern int hyla_prof_on; /* set from HYLA_PROFILE by hyla_prof_init */

/* Read HYLA_PROFILE (1 = on). Idempotent. */
void hyla_prof_init(void);
/* Start of a forward pass: sync and take the time. */
void hyla_prof_begin(const hyla_ops *o, void *ctx);
/* Sync and charge the time since the previous mark (or begin) to label (a string literal). */
void hyla_prof_mark(const hyla_ops *o, void *ctx, int decode, const char *label);
/* Forget what was measured. */
void hyla_prof_reset(void);
/* One JSON object member, "profile":{"prefill":[{"label":..,"ms":..,"calls":..,"share":..},..],
 * "decode":[..]}, labels in first-seen order; nothing when off. */
void hyla_prof_print_json(FILE *f);

#ifdef __cplusplus
}
#endif
#endif
