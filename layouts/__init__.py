"""The shipped layouts (the top-level layouts/ folder, linked into the package as specdraft/layouts), installed as
package data so a layout is found by name from any folder."""
