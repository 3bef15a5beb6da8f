# shellcheck shell=bash disable=SC2034  # status: read by the sourcing test
# Sourced by the script tests: `expect FILE REGEX` records a failure (status=1, the line it
# wanted) unless a line of FILE matches the extended regex.
status=0
expect() {
    grep -Eq -- "$2" "$1" || {
        echo "expected a line matching: $2"
        status=1
    }
}
