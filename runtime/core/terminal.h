/*
 * terminal.h — how much of a line fits one row of a terminal (terminal.c), for the lines redrawn in
 * place after \r: the launcher's live line and a single process's progress line (runtime/host), and
 * the converter's progress bar (runtime/convert). A line wider than the terminal wraps, and the \r
 * that starts its redraw reaches back only to its last row, so each redraw left a trail.
 *
 * Internal header.
 */
#ifndef WK_CORE_TERMINAL_H
#define WK_CORE_TERMINAL_H

#include <stddef.h>

#include "core.h"

/* The bytes of text[0..length) that fit one row of the terminal on fd: its columns less one (some
 * terminals wrap on filling the last), COLUMNS where fd reports none (not a terminal), else 80; a
 * UTF-8 character is never cut. Bytes count as columns: the lines are ASCII. */
WK_INTERNAL_EXPORT size_t wk_terminal_fit(int fd, const char *text, size_t length);

#endif /* WK_CORE_TERMINAL_H */
