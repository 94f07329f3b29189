//go:build !linux

package bench

import (
	"errors"
	"time"
)

var errNoCPU = errors.New("bench: CPU times are read from /proc, on Linux only")

func processCPU(int) (time.Duration, error) { return 0, errNoCPU }

func clientCPU() (time.Duration, error) { return 0, errNoCPU }
