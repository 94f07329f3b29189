//go:build race

package main

// raceEnabled says the tests run with -race: the binary is built with it
// too.
const raceEnabled = true
