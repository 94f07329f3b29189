package bench

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat: USER_HZ,
// which Linux fixes at 100 on every architecture Go supports.
const clockTick = 10 * time.Millisecond

// processCPU returns the CPU time process pid has used: the sum over
// its threads of the time each has run, from /proc/<pid>/task/*/schedstat,
// in nanoseconds (the time of a thread that has ended is not counted: Go
// rarely ends one). Where schedstat is missing (a kernel without
// CONFIG_SCHED_INFO) it is read from /proc/<pid>/stat, in clock ticks of
// 10ms: a window of 100 operations of 1ms then tells CPU per operation
// only to 100µs.
func processCPU(pid int) (time.Duration, error) {
	if d, err := schedCPU(pid); err == nil {
		return d, nil
	}
	return statCPU(pid)
}

// schedCPU is processCPU from schedstat.
func schedCPU(pid int) (time.Duration, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/schedstat")
		if errors.Is(err, fs.ErrNotExist) {
			continue // the thread ended meanwhile
		}
		if err != nil {
			return 0, fmt.Errorf("bench: %w", err)
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, fmt.Errorf("bench: %s/%s/schedstat: %q", dir, t.Name(), b)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: %s/%s/schedstat: %w", dir, t.Name(), err)
		}
		sum += time.Duration(ns)
	}
	return sum, nil
}

// statCPU is processCPU from /proc/<pid>/stat (fields 14 and 15, user and
// system time in clock ticks).
func statCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: /proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:]) // from field 3 on
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: /proc/%d/stat: %q", pid, s)
	}
	var ticks int64
	for _, x := range f[11:13] { // utime, stime
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: /proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// clientCPU returns the user+system CPU time this process has used.
func clientCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("bench: getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
