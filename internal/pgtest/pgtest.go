// Package pgtest gives a test a PostgreSQL schema of its own on the server
// that $BUSHOST_TEST_PG_DSN names (make test starts one: scripts/pg.sh), so
// that tests sharing the server run in parallel and leave nothing behind.
package pgtest

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // to make and drop the schema

	"github.com/bushost/bushost/internal/testenv"
)

// Env names the server's DSN.
const Env = "BUSHOST_TEST_PG_DSN"

// Configured reports whether a server is named.
func Configured() bool { return os.Getenv(Env) != "" }

// SchemaDSN makes a schema named prefix_<random> on the server, drops it at
// the test's cleanup, and returns a DSN whose search_path is that schema.
// Without a server it skips the test with a loud message naming what, left
// untested, needs one (a failure with BUSHOST_TEST_REQUIRE_ALL=1).
func SchemaDSN(t testing.TB, prefix, untested string) string {
	t.Helper()
	base := os.Getenv(Env)
	if base == "" {
		testenv.Missing(t, "PostgreSQL", "%s not set: %s", Env, untested)
	}
	buf := make([]byte, 6)
	rand.Read(buf)
	schema := prefix + "_" + hex.EncodeToString(buf)
	db, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE SCHEMA ` + schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		if db, err := sql.Open("pgx", base); err == nil {
			db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
			db.Close()
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
