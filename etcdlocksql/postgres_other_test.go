//go:build !unix

package etcdlocksql_test

// pgServer is not started on this system.
type pgServer struct {
	bin  string
	port int
}

func (*pgServer) dsn(string) string { return "" }
func (*pgServer) stop()             {}

func startPostgres() (*pgServer, string, error) {
	return nil, "the tests start PostgreSQL on Unix systems only", nil
}
