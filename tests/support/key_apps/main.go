// What a Go net/http app reads: r.FormValue (the body's value over the
// query's), and path segments of r.URL.EscapedPath (as sent).
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	os.Stdout.Close()
	http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		segments := strings.Split(r.URL.EscapedPath(), "/")
		segment := ""
		if len(segments) > 2 {
			segment = segments[2]
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{
			"form":    r.FormValue("id"),
			"segment": segment,
			"role":    r.Header.Get("X-Rolegate-Role"),
		})
	}))
}
