// Command etcd is etcd's own server, built from the Go module proxy for
// etcdlock's tests against real server processes.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
